#include "hpm/cli/distill_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/comm/gloo.h"
#include "hpm/config/strategy.h"
#include "hpm/config/training_run.h"
#include "hpm/data/in_memory.h"
#include "hpm/distill/codistill.h"
#include "hpm/distill/distiller.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/tfrecord.h"
#include "hpm/nn/losses.h"
#include "hpm/nn/objective.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/random.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/checkpoint.h"
#include "hpm/train/tensorboard.h"
#include "hpm/train/trainer.h"

namespace hpm::cli {

namespace {

// ---- data, as hpm train reads it ----------------------------------------------------------------

// Worker 0 of a multi-worker job (`hpm launch`), or a process on its own: the one that prints and
// writes the report.
bool chief_process() {
  const auto env = comm::gloo_options_from_env();
  return !env || env->rank == 0;
}

// ---- training -----------------------------------------------------------------------------------

struct Trained {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<optim::Optimizer> optimizer;
  train::TrainerState state;
  train::EvalResult test;
  double seconds = 0;
  bool chief = true;  // this process reports (worker 0 of a multi-worker job)
};

// Builds cfg's model from cfg's seed and trains it as hpm train would: on one device or under
// cfg's [strategy] (replicas as threads, or this process's share of `hpm launch`'s workers), a
// language model by steps with validation every eval_every. With a distiller, the loss is the
// distiller's around the run's own objective. Evaluates the result on `test`; `csv_suffix` names
// this run's metrics CSV beside [train] metrics_csv ("" = that file itself).
Trained train_model(const Config& cfg, const char* what,
                    std::shared_ptr<const distill::Distiller> distiller,
                    const data::LabelledData& test, bool write_checkpoints,
                    const std::string& csv_suffix = "", comm::CommunicatorPtr* workers = nullptr) {
  // The run's own objective, with [train] label_smoothing; a distiller blends its teachers in.
  const std::shared_ptr<const nn::Objective> base = build_objective(cfg);
  TrainingRun run = make_training_run(
      cfg, WorkerFlags{}, workers,
      distiller ? std::make_shared<distill::DistillationObjective>(std::move(distiller), base)
                : base);
  Trained t;
  t.model = run.model;
  t.optimizer = run.optimizer;
  t.chief = run.chief;
  const std::shared_ptr<distribute::Strategy>& strategy = run.strategy;
  train::Trainer* trainer = run.trainer.get();
  const bool lm = cfg.token_source();
  const std::int64_t examples = run.train_examples;
  const data::Dataset& pipeline = run.pipeline;
  if (t.chief) add_loggers(*trainer, cfg, csv_suffix);
  train::FitOptions& fo = run.fit;
  if (!write_checkpoints) fo.checkpoint_dir.clear();
  if (t.chief) {
    std::printf("%s (%s): %lld parameters, ", what, cfg.path.c_str(),
                static_cast<long long>(t.model->num_parameters()));
    if (lm) {
      std::printf("%lld steps of batch %lld x %lld tokens", static_cast<long long>(cfg.max_steps),
                  static_cast<long long>(cfg.batch_size),
                  static_cast<long long>(cfg.gpt.block_size));
    } else {
      std::printf("%lld training examples, batch %lld, %lld epoch(s)",
                  static_cast<long long>(examples), static_cast<long long>(cfg.batch_size),
                  static_cast<long long>(cfg.epochs));
    }
    if (strategy) {
      std::printf(", strategy %s: %d replica(s) in sync", strategy->name().c_str(),
                  strategy->num_replicas_in_sync());
    }
    std::printf("\n");
  }
  const train::FitResult r = trainer->fit(pipeline, &test, fo);
  t.state = trainer->state();
  t.test = trainer->evaluate(test);
  t.seconds = r.seconds;
  if (t.chief) {
    if (lm) {
      std::printf("%s: val loss %.4f, val token accuracy %.4f, %.1f s\n", what, t.test.loss,
                  t.test.accuracy, r.seconds);
    } else {
      std::printf("%s: test accuracy %.4f, test loss %.4f, %.1f s\n", what, t.test.accuracy,
                  t.test.loss, r.seconds);
    }
  }
  return t;
}

// A teacher must answer the student's inputs with predictions over the student's outputs: a GPT
// for a GPT (the same vocabulary, a context at least the student's block), a classifier for a
// classifier.
void check_teacher(const Config& student, const Config& teacher, const TeacherSpec& spec) {
  const bool lm = student.model_kind == "gpt";
  const std::string at = spec.where + ": teacher " + spec.config;
  if (lm != (teacher.model_kind == "gpt")) {
    throw ConfigError(at + " is a " + teacher.model_kind + " model, the student (" + student.path +
                      ") a " + student.model_kind +
                      ": a language model learns from language models, a classifier from "
                      "classifiers");
  }
  if (!lm) return;
  if (teacher.gpt.vocab_size != student.gpt.vocab_size) {
    throw ConfigError(at + " has vocab_size " + std::to_string(teacher.gpt.vocab_size) +
                      ", the student " + std::to_string(student.gpt.vocab_size) +
                      ": soft targets need the same vocabulary");
  }
  if (tokenizer_id(*teacher.text_tokenizer) != tokenizer_id(*student.text_tokenizer)) {
    throw ConfigError(at + " reads text with tokenizer " + tokenizer_id(*teacher.text_tokenizer) +
                      ", the student with " + tokenizer_id(*student.text_tokenizer) +
                      ": the same ids must stand for the same text in both");
  }
  if (teacher.gpt.block_size < student.gpt.block_size) {
    throw ConfigError(at + " has block_size " + std::to_string(teacher.gpt.block_size) +
                      ", shorter than the student's " + std::to_string(student.gpt.block_size) +
                      ": the teacher must read the student's whole window");
  }
}

struct LoadedTeacher {
  std::shared_ptr<nn::Module> model;
  bool trained = false;  // here, for want of a checkpoint
};

// A teacher from its checkpoint, or trained from its own config when there is none (and then
// saved where the checkpoint was expected, so the next run loads it).
LoadedTeacher load_or_train_teacher(const TeacherSpec& spec, const Config& student,
                                    const data::LabelledData& test, int index) {
  Config tcfg = load_config(spec.config);
  tcfg.threads = student.threads;
  check_teacher(student, tcfg, spec);
  LoadedTeacher out;
  const std::filesystem::path ckpt(spec.checkpoint);
  const bool has_checkpoint =
      !spec.checkpoint.empty() && (std::filesystem::exists(ckpt / "latest") ||
                                   std::filesystem::exists(ckpt / "trainer_state.json"));
  // Weights alone: a .safetensors file, or a directory holding model.safetensors and no trainer
  // state (an export, a PyTorch state dict). Loaded strictly, never retrained over.
  std::string weights;
  if (!spec.checkpoint.empty() && !has_checkpoint) {
    if (std::filesystem::is_regular_file(ckpt)) {
      weights = spec.checkpoint;
    } else if (std::filesystem::is_regular_file(ckpt / "model.safetensors")) {
      weights = (ckpt / "model.safetensors").string();
    }
  }
  if (!weights.empty()) {
    tcfg.init_from = weights;
    tcfg.init_strict = true;
    out.model = build_model(tcfg);
    if (chief_process()) {
      std::printf("teacher %d: %s, weights from %s\n", index, tcfg.path.c_str(), weights.c_str());
    }
    return out;
  }
  if (has_checkpoint) {
    auto model = build_model(tcfg);
    check_checkpoint_tokenizer(
        train::load_checkpoint(spec.checkpoint, *model, nullptr), student,
        "teacher " + std::to_string(index) + "'s checkpoint " + spec.checkpoint);
    if (chief_process()) {
      std::printf("teacher %d: %s loaded from %s\n", index, tcfg.path.c_str(),
                  spec.checkpoint.c_str());
    }
    out.model = model;
    return out;
  }
  // Every worker of a multi-worker job would train its own copy and race to save it.
  if (const auto env = comm::gloo_options_from_env(); env && env->world_size > 1) {
    throw ConfigError(spec.where + ": teacher " + std::to_string(index) + " (" + spec.config +
                      ") has no checkpoint at \"" + spec.checkpoint +
                      "\": under several workers a teacher must be trained first (hpm train " +
                      spec.config + ") and given by its checkpoint or weights");
  }
  if (!tcfg.backup_dir.empty()) {
    refuse_setting(tcfg, "train", "backup_dir",
                   "is not written when hpm distill trains a teacher: give the teacher a "
                   "checkpoint (teacher_checkpoint), or train it first with hpm train");
  }
  const std::string what = "teacher " + std::to_string(index);
  Trained t =
      train_model(tcfg, what.c_str(), nullptr, test, true, "teacher-" + std::to_string(index));
  if (!spec.checkpoint.empty()) {
    const std::string dir =
        train::save_checkpoint(spec.checkpoint, *t.model, *t.optimizer, t.state);
    std::printf("%s: saved to %s\n", what.c_str(), dir.c_str());
  }
  out.model = t.model;
  out.trained = true;
  return out;
}

nlohmann::json churn_json(const distill::Churn& c) {
  return {{"churn", c.churn},
          {"good_churn", c.good_churn},
          {"bad_churn", c.bad_churn},
          {"examples", c.examples}};
}

}  // namespace

CLI::App* add_distill_command(CLI::App& app, DistillCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "distill", "distill CONFIG's model from the teachers of its [distill] section");
  add_config_flags(cmd, o.config_path, o.overrides,
                   "TOML run configuration with a [distill] section (the student's)", &o.report);
  cmd->add_option("--threads", o.threads, "intra-op threads (default: [train] threads, else 1)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--seed", o.seed, "the student's random seed (overrides [train] seed)")
      ->check(seed_range());
  return cmd;
}

CLI::App* add_churn_command(CLI::App& app, ChurnCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "churn", "share of test examples on which two checkpoints' top-1 predictions differ");
  cmd->add_option("checkpoint_a", o.checkpoint_a, "checkpoint directory of model A")->required();
  cmd->add_option("checkpoint_b", o.checkpoint_b, "checkpoint directory of model B")->required();
  add_config_flags(cmd, o.config_path, o.overrides, "TOML config of the model (and the test data)",
                   &o.report);
  cmd->add_option("--threads", o.threads, "intra-op threads (default: [train] threads, else 1)")
      ->check(CLI::Range(1, 1024));
  return cmd;
}

int run_distill(const DistillCommandOptions& o) {
  // One process group for every model trained here under multi_worker_mirrored (see
  // build_strategy); declared first, so it outlives the strategies that use it.
  comm::CommunicatorPtr workers;
  Config cfg = load_config(o.config_path, o.overrides);
  if (o.threads > 0) cfg.threads = o.threads;
  if (o.seed >= 0) cfg.seed = static_cast<std::uint64_t>(o.seed);
  if (cfg.noisy_student.present) {
    try {
      return run_noisy_student(cfg, o.report);
    } catch (const train::TrainingError& e) {
      std::fprintf(stderr, "hpm: error: %s\n", e.what());
      return 3;
    }
  }
  if (!cfg.distill.present || cfg.distill.teachers.empty()) {
    throw ConfigError(cfg.path +
                      ": hpm distill needs a [distill] section with teacher_config (and "
                      "teacher_checkpoint) or teachers = [{config, checkpoint, weight}, ...]");
  }
  refuse_train_only_settings(cfg, "hpm distill");
  // One command trains teachers, students and baselines in turn: one backup could not resume it.
  if (!cfg.backup_dir.empty()) {
    refuse_setting(cfg, "train", "backup_dir",
                   "is not supported by hpm distill, which backs up none of the runs it trains "
                   "(checkpoint_dir keeps the student's checkpoints)");
  }
  // The teachers run on the student's batches, where the student trains: both on the CPU for now.
  if (cfg.device != "cpu") {
    refuse_setting(cfg, "train", "device",
                   "= \"" + cfg.device +
                       "\" is not applied by hpm distill yet: its teachers and "
                       "students train on the CPU");
  }
  use_threads(cfg.threads);
  const data::LabelledData test = test_set(cfg);
  const bool lm = cfg.token_source();
  const bool chief = chief_process();

  try {
    // Teachers first: each trained from its own config when it has no checkpoint yet.
    std::vector<distill::Teacher> teachers;
    nlohmann::json teacher_reports = nlohmann::json::array();
    for (std::size_t i = 0; i < cfg.distill.teachers.size(); ++i) {
      const TeacherSpec& spec = cfg.distill.teachers[i];
      LoadedTeacher t = load_or_train_teacher(spec, cfg, test, static_cast<int>(i));
      const distill::EnsembleScore e =
          distill::evaluate_ensemble({{t.model, 1.0f}}, test, lm ? 16 : 1000);
      if (chief) {
        std::printf("teacher %zu: %s %.4f, %s %.4f, %lld parameters\n", i,
                    lm ? "val loss" : "test loss", e.loss, lm ? "token accuracy" : "accuracy",
                    e.accuracy, static_cast<long long>(t.model->num_parameters()));
      }
      teacher_reports.push_back({{"config", spec.config},
                                 {"checkpoint", spec.checkpoint},
                                 {"weight", spec.weight},
                                 {"trained", t.trained},
                                 {"parameters", t.model->num_parameters()},
                                 {"test_loss", e.loss},
                                 {"test_accuracy", e.accuracy}});
      teachers.push_back({t.model, spec.weight});
    }
    // Augmented inputs never repeat: caching their targets would only fill memory. Nor do a
    // language model's windows at random starts.
    const distill::DistillOptions options{cfg.distill.alpha, cfg.distill.temperature,
                                          cfg.distill.cache_teacher && cfg.augment.empty() && !lm};
    auto distiller = std::make_shared<const distill::Distiller>(teachers, options);
    // What the student learns from: the weighted average of the teachers' probabilities.
    const distill::EnsembleScore ensemble =
        distill::evaluate_ensemble(teachers, test, lm ? 16 : 1000);
    const double teacher_acc = ensemble.accuracy;
    const Tensor labels = test.labels.reshape({test.labels.numel()});  // one per row (position)

    char what[96];
    std::snprintf(what, sizeof what, "student (alpha %g, T %g)", cfg.distill.alpha,
                  cfg.distill.temperature);
    const Trained student = train_model(cfg, what, distiller, test, true, "", &workers);
    nlohmann::json report = {{"teacher_test_accuracy", teacher_acc},
                             {"teacher_test_loss", ensemble.loss},
                             {"language_model", lm},
                             {"strategy", cfg.strategy},
                             {"max_steps", lm ? nlohmann::json(cfg.max_steps) : nlohmann::json()},
                             {"teachers", teacher_reports},
                             {"student_test_accuracy", student.test.accuracy},
                             {"student_test_loss", student.test.loss},
                             {"student_seconds", student.seconds},
                             {"alpha", cfg.distill.alpha},
                             {"temperature", cfg.distill.temperature},
                             {"epochs", cfg.epochs},
                             {"seed", cfg.seed},
                             {"student_parameters", student.model->num_parameters()},
                             {"teacher_cache", options.cache_targets},
                             {"teacher_cache_hits", distiller->cache_hits()},
                             {"teacher_cache_misses", distiller->cache_misses()}};
    if (options.cache_targets && chief) {
      std::printf("teacher cache: %lld rows answered from it, %lld run through the teachers\n",
                  static_cast<long long>(distiller->cache_hits()),
                  static_cast<long long>(distiller->cache_misses()));
    }
    if (cfg.distill.m_on_m) {
      // M on M: a student per teacher (seeds seed, seed + 1, ...), then the students' ensemble.
      std::vector<std::shared_ptr<nn::Module>> students;
      nlohmann::json accuracies = nlohmann::json::array();
      for (std::size_t i = 0; i < teachers.size(); ++i) {
        Config scfg = cfg;
        scfg.seed = cfg.seed + i;
        scfg.checkpoint_dir.clear();
        distill::DistillOptions one = options;
        one.cache_targets = false;  // one pass per teacher: nothing would be reused
        const std::string what = "M on M student " + std::to_string(i);
        Trained t = train_model(scfg, what.c_str(),
                                std::make_shared<const distill::Distiller>(
                                    std::vector<distill::Teacher>{{teachers[i].model, 1.0f}}, one),
                                test, false, "m-on-m-" + std::to_string(i), &workers);
        accuracies.push_back(t.test.accuracy);
        students.push_back(t.model);
      }
      const double acc = distill::ensemble_accuracy(students, test);
      if (chief) {
        std::printf("M on M: ensemble of %zu students, test accuracy %.4f\n", students.size(), acc);
      }
      report["m_on_m_test_accuracy"] = acc;
      report["m_on_m_student_test_accuracies"] = accuracies;
    }
    if (cfg.distill.baseline) {
      // Same seed: same initial weights and the same batches; only the loss differs.
      const Trained base = train_model(cfg, "baseline student (labels only)", nullptr, test, false,
                                       "baseline", &workers);
      const std::int64_t batch = lm ? 16 : 1000;
      const distill::Churn c =
          distill::churn(distill::predict_logits(*base.model, test.inputs, batch),
                         distill::predict_logits(*student.model, test.inputs, batch), labels);
      if (chief) {
        std::printf(
            "teacher %.4f, distilled student %.4f, baseline student %.4f%s; churn baseline -> "
            "distilled %.4f (good %.4f, bad %.4f)\n",
            teacher_acc, student.test.accuracy, base.test.accuracy, lm ? " (token accuracy)" : "",
            c.churn, c.good_churn, c.bad_churn);
        if (lm) {
          std::printf("val loss: teachers %.4f, distilled student %.4f, baseline student %.4f\n",
                      ensemble.loss, student.test.loss, base.test.loss);
        }
      }
      report["baseline_student_test_accuracy"] = base.test.accuracy;
      report["baseline_student_test_loss"] = base.test.loss;
      report["baseline_to_student_churn"] = churn_json(c);
    } else if (chief) {
      std::printf("teacher %.4f, distilled student %.4f\n", teacher_acc, student.test.accuracy);
    }
    if (chief) write_report(o.report, report);
  } catch (const train::TrainingError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return 3;
  }
  return 0;
}

int run_churn(const ChurnCommandOptions& o) {
  Config cfg = load_config(o.config_path, o.overrides);
  if (o.threads > 0) cfg.threads = o.threads;
  use_threads(cfg.threads);
  const auto a = load_trained_model(cfg, o.checkpoint_a),
             b = load_trained_model(cfg, o.checkpoint_b);
  const data::LabelledData test = test_set(cfg);
  // Rows: a language model's next-token predictions, one per position.
  const std::int64_t batch = cfg.token_source() ? 16 : 1000;
  const distill::CopiesScore s =
      distill::score_copies({distill::predict_logits(*a, test.inputs, batch),
                             distill::predict_logits(*b, test.inputs, batch)},
                            test.labels.reshape({test.labels.numel()}));
  const distill::Churn& c = s.pairs.at(0).churn;
  const double acc_a = s.accuracy[0], acc_b = s.accuracy[1];
  std::printf(
      "churn %.4f (good %.4f: A wrong, B right; bad %.4f: A right, B wrong) on %lld test "
      "examples; accuracy A %.4f, B %.4f\n",
      c.churn, c.good_churn, c.bad_churn, static_cast<long long>(c.examples), acc_a, acc_b);
  nlohmann::json report = churn_json(c);
  report["accuracy_a"] = acc_a;
  report["accuracy_b"] = acc_b;
  report["checkpoint_a"] = o.checkpoint_a;
  report["checkpoint_b"] = o.checkpoint_b;
  write_report(o.report, report);
  return 0;
}

}  // namespace hpm::cli
