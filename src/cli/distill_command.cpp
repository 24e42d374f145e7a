#include "hpm/cli/distill_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hpm/cli/config.h"
#include "hpm/cli/datasets.h"
#include "hpm/cli/options.h"
#include "hpm/data/in_memory.h"
#include "hpm/distill/distiller.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/tfrecord.h"
#include "hpm/nn/losses.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/random.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/checkpoint.h"
#include "hpm/train/trainer.h"

namespace hpm::cli {

namespace {

// ---- data, as hpm train reads it ----------------------------------------------------------------

void set_threads(int threads) {
  warn_if_oversubscribed(threads);
  set_num_threads(threads);
  Device::cpu().set_threads(threads);
}

// Distillation trains on one device: the teachers run on each batch's inputs, which a strategy's
// replicas do not hand to the loss.
void require_one_device(const Config& cfg) {
  if (cfg.strategy != "one_device") {
    throw ConfigError(cfg.path + ": [strategy] kind must be one_device for hpm distill, got \"" +
                      cfg.strategy + "\"");
  }
}

// ---- training -----------------------------------------------------------------------------------

struct Trained {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<optim::Optimizer> optimizer;
  train::TrainerState state;
  train::EvalResult test;
  double seconds = 0;
};

// Builds cfg's model from cfg's seed and trains it as hpm train would (one device), with the
// distiller's loss when one is given; evaluates it on `test`.
Trained train_model(const Config& cfg, const char* what,
                    std::shared_ptr<const distill::Distiller> distiller,
                    const data::LabelledData& test, bool write_checkpoints) {
  require_one_device(cfg);
  manual_seed(cfg.seed);  // model initialization draws from the default generator
  Trained t;
  t.model = build_model(cfg);
  t.optimizer = build_optimizer(cfg, *t.model);
  train::Trainer trainer(t.model, t.optimizer, build_schedule(cfg));
  if (distiller) distill::attach(trainer, std::move(distiller));
  std::int64_t examples = 0;
  const data::Dataset pipeline = training_pipeline(cfg, &examples);
  trainer.add_callback(
      std::make_shared<train::ProgressCallback>(stdout, isatty(fileno(stdout)) != 0, cfg.epochs));
  train::FitOptions fo = fit_options(cfg);
  if (!write_checkpoints) fo.checkpoint_dir.clear();
  std::printf("%s (%s): %lld parameters, %lld training examples, batch %lld, %lld epoch(s)\n", what,
              cfg.path.c_str(), static_cast<long long>(t.model->num_parameters()),
              static_cast<long long>(examples), static_cast<long long>(cfg.batch_size),
              static_cast<long long>(cfg.epochs));
  const train::FitResult r = trainer.fit(pipeline, nullptr, fo);
  t.state = trainer.state();
  t.test = trainer.evaluate(test);
  t.seconds = r.seconds;
  std::printf("%s: test accuracy %.4f, test loss %.4f, %.1f s\n", what, t.test.accuracy,
              t.test.loss, r.seconds);
  return t;
}

struct LoadedTeacher {
  std::shared_ptr<nn::Module> model;
  bool trained = false;  // here, for want of a checkpoint
};

// A teacher from its checkpoint, or trained from its own config when there is none (and then
// saved where the checkpoint was expected, so the next run loads it).
LoadedTeacher load_or_train_teacher(const TeacherSpec& spec, int threads,
                                    const data::LabelledData& test, int index) {
  Config tcfg = load_config(spec.config);
  tcfg.threads = threads;
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
    std::printf("teacher %d: %s, weights from %s\n", index, tcfg.path.c_str(), weights.c_str());
    return out;
  }
  if (has_checkpoint) {
    auto model = build_model(tcfg);
    train::load_checkpoint(spec.checkpoint, *model, nullptr);
    std::printf("teacher %d: %s loaded from %s\n", index, tcfg.path.c_str(),
                spec.checkpoint.c_str());
    out.model = model;
    return out;
  }
  const std::string what = "teacher " + std::to_string(index);
  Trained t = train_model(tcfg, what.c_str(), nullptr, test, true);
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

void write_report(const std::string& path, const nlohmann::json& j) {
  if (!path.empty()) io::write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace

CLI::App* add_distill_command(CLI::App& app, DistillCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "distill", "distill CONFIG's model from the teachers of its [distill] section");
  cmd->add_option("config", o.config_path, "TOML run configuration with a [distill] section")
      ->required();
  cmd->add_option("--set", o.overrides,
                  "override a value of the student's config: section.key=value (repeatable)");
  cmd->add_option("--report", o.report, "write a JSON report to this file");
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
  cmd->add_option("config", o.config_path, "TOML config of the model (and the test data)")
      ->required();
  cmd->add_option("--set", o.overrides, "override a config value: section.key=value (repeatable)");
  cmd->add_option("--report", o.report, "write a JSON report to this file");
  cmd->add_option("--threads", o.threads, "intra-op threads (default: [train] threads, else 1)")
      ->check(CLI::Range(1, 1024));
  return cmd;
}

int run_distill(const DistillCommandOptions& o) {
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
  require_one_device(cfg);
  set_threads(cfg.threads);
  const data::LabelledData test = test_set(cfg);

  try {
    // Teachers first: each trained from its own config when it has no checkpoint yet.
    std::vector<distill::Teacher> teachers;
    nlohmann::json teacher_reports = nlohmann::json::array();
    for (std::size_t i = 0; i < cfg.distill.teachers.size(); ++i) {
      const TeacherSpec& spec = cfg.distill.teachers[i];
      LoadedTeacher t = load_or_train_teacher(spec, cfg.threads, test, static_cast<int>(i));
      const double acc = distill::ensemble_accuracy({t.model}, test);
      std::printf("teacher %zu: test accuracy %.4f\n", i, acc);
      teacher_reports.push_back({{"config", spec.config},
                                 {"checkpoint", spec.checkpoint},
                                 {"weight", spec.weight},
                                 {"trained", t.trained},
                                 {"test_accuracy", acc}});
      teachers.push_back({t.model, spec.weight});
    }
    // Augmented inputs never repeat: caching their targets would only fill memory.
    const distill::DistillOptions options{cfg.distill.alpha, cfg.distill.temperature,
                                          cfg.distill.cache_teacher && cfg.augment.empty()};
    auto distiller = std::make_shared<const distill::Distiller>(teachers, options);
    // What the student learns from: the weighted average of the teachers' probabilities (by a
    // distiller without the cache, which is for training rows only).
    double teacher_acc = 0;
    {
      const distill::Distiller ensemble(teachers, {options.alpha, options.temperature, false});
      std::int64_t correct = 0;
      for (std::int64_t begin = 0; begin < test.size(); begin += 1000) {
        const std::int64_t n = std::min<std::int64_t>(1000, test.size() - begin);
        correct += nn::top1_correct(ensemble.soft_targets(test.inputs.narrow(begin, n)),
                                    test.labels.narrow(begin, n));
      }
      if (test.size() > 0) teacher_acc = static_cast<double>(correct) / test.size();
    }

    char what[96];
    std::snprintf(what, sizeof what, "student (alpha %g, T %g)", cfg.distill.alpha,
                  cfg.distill.temperature);
    const Trained student = train_model(cfg, what, distiller, test, true);
    nlohmann::json report = {{"teacher_test_accuracy", teacher_acc},
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
    if (options.cache_targets) {
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
                                test, false);
        accuracies.push_back(t.test.accuracy);
        students.push_back(t.model);
      }
      const double acc = distill::ensemble_accuracy(students, test);
      std::printf("M on M: ensemble of %zu students, test accuracy %.4f\n", students.size(), acc);
      report["m_on_m_test_accuracy"] = acc;
      report["m_on_m_student_test_accuracies"] = accuracies;
    }
    if (cfg.distill.baseline) {
      // Same seed: same initial weights and the same batches; only the loss differs.
      const Trained base = train_model(cfg, "baseline student (labels only)", nullptr, test, false);
      const distill::Churn c =
          distill::churn(distill::predict_logits(*base.model, test.inputs),
                         distill::predict_logits(*student.model, test.inputs), test.labels);
      std::printf(
          "teacher %.4f, distilled student %.4f, baseline student %.4f; churn baseline -> "
          "distilled %.4f (good %.4f, bad %.4f)\n",
          teacher_acc, student.test.accuracy, base.test.accuracy, c.churn, c.good_churn,
          c.bad_churn);
      report["baseline_student_test_accuracy"] = base.test.accuracy;
      report["baseline_student_test_loss"] = base.test.loss;
      report["baseline_to_student_churn"] = churn_json(c);
    } else {
      std::printf("teacher %.4f, distilled student %.4f\n", teacher_acc, student.test.accuracy);
    }
    write_report(o.report, report);
  } catch (const train::TrainingError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return 3;
  }
  return 0;
}

int run_churn(const ChurnCommandOptions& o) {
  Config cfg = load_config(o.config_path, o.overrides);
  if (o.threads > 0) cfg.threads = o.threads;
  set_threads(cfg.threads);
  auto a = build_model(cfg), b = build_model(cfg);
  train::load_checkpoint(o.checkpoint_a, *a, nullptr);
  train::load_checkpoint(o.checkpoint_b, *b, nullptr);
  const data::LabelledData test = test_set(cfg);
  const Tensor la = distill::predict_logits(*a, test.inputs);
  const Tensor lb = distill::predict_logits(*b, test.inputs);
  const distill::Churn c = distill::churn(la, lb, test.labels);
  const auto accuracy = [&](const Tensor& logits) {
    return test.size() ? static_cast<double>(nn::top1_correct(logits, test.labels)) /
                             static_cast<double>(test.size())
                       : 0.0;
  };
  const double acc_a = accuracy(la), acc_b = accuracy(lb);
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
