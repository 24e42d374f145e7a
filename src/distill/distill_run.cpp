#include "hpm/distill/distill_run.h"

#include <filesystem>

#include "hpm/comm/gloo.h"
#include "hpm/config/datasets.h"
#include "hpm/config/training_run.h"
#include "hpm/data/in_memory.h"
#include "hpm/data/input_pipeline.h"
#include "hpm/train/checkpoint.h"
#include "hpm/train/trainer.h"

namespace hpm::distill {

namespace {

using config::ConfigError;
using config::format_line;

// Rows per forward pass when scoring: a language model's rows are whole windows.
std::int64_t score_batch(const config::Config& cfg) { return cfg.token_source() ? 16 : 1000; }

// Worker 0 of a multi-worker job (`hpm launch`), or a process on its own.
bool chief_process() {
  const auto env = comm::gloo_options_from_env();
  return !env || env->rank == 0;
}

struct Trained {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<optim::Optimizer> optimizer;
  train::TrainerState state;
  RunScore score;
};

// Builds cfg's model from cfg's seed and trains it as hpm train would (config::make_training_run);
// with a distiller, the loss is the distiller's around the run's own objective. Scores the result
// on `test`; `run` names this run's metrics beside [train] metrics_csv ("" = that file itself).
Trained train_model(const config::Config& cfg, const std::string& what,
                    std::shared_ptr<const Distiller> distiller, const data::LabelledData& test,
                    bool write_checkpoints, const config::RunLog& log, const std::string& run = "",
                    comm::CommunicatorPtr* workers = nullptr) {
  const std::shared_ptr<const nn::Objective> base = config::build_objective(cfg);
  config::TrainingRun r = config::make_training_run(
      cfg, config::WorkerFlags{}, workers,
      distiller ? std::make_shared<DistillationObjective>(std::move(distiller), base) : base);
  const bool say = r.chief && log;
  if (r.chief) config::add_loggers(*r.trainer, cfg, run);
  if (!write_checkpoints) r.fit.checkpoint_dir.clear();
  if (say) {
    std::string line = format_line("%s (%s): %lld parameters, ", what.c_str(), cfg.path.c_str(),
                                   static_cast<long long>(r.model->num_parameters()));
    line += cfg.token_source() ? format_line("%lld steps of batch %lld x %lld tokens",
                                             static_cast<long long>(cfg.max_steps),
                                             static_cast<long long>(cfg.batch_size),
                                             static_cast<long long>(cfg.gpt.block_size))
                               : format_line("%lld training examples, batch %lld, %lld epoch(s)",
                                             static_cast<long long>(r.train_examples),
                                             static_cast<long long>(cfg.batch_size),
                                             static_cast<long long>(cfg.epochs));
    if (r.strategy) {
      line += format_line(", strategy %s: %d replica(s) in sync", r.strategy->name().c_str(),
                          r.strategy->num_replicas_in_sync());
    }
    log(line);
  }
  const train::FitResult fit = r.trainer->fit(r.pipeline, &test, r.fit);
  const train::EvalResult eval = r.trainer->evaluate(test);
  Trained t{r.model, r.optimizer, r.trainer->state(),
            RunScore{eval.loss, eval.accuracy, fit.seconds, r.model->num_parameters()}};
  if (say) {
    log(cfg.token_source() ? format_line("%s: val loss %.4f, val token accuracy %.4f, %.1f s",
                                         what.c_str(), eval.loss, eval.accuracy, fit.seconds)
                           : format_line("%s: test accuracy %.4f, test loss %.4f, %.1f s",
                                         what.c_str(), eval.accuracy, eval.loss, fit.seconds));
  }
  return t;
}

// The deterministic part of an augment list (normalize, resize: what evaluation applies too), as
// text to compare and to quote.
std::string preprocessing_text(const std::vector<data::AugmentOp>& ops) {
  std::string out;
  const auto numbers = [](const std::vector<float>& v) {
    std::string t;
    for (float x : v) t += (t.empty() ? "" : ", ") + format_line("%g", static_cast<double>(x));
    return "[" + t + "]";
  };
  for (const data::AugmentOp& op : ops) {
    std::string one;
    if (op.op == "normalize")
      one = "normalize(mean " + numbers(op.mean) + ", std " + numbers(op.std) + ")";
    if (op.op == "resize")
      one = format_line("resize(%lldx%lld)", static_cast<long long>(op.height),
                        static_cast<long long>(op.width));
    if (!one.empty()) out += (out.empty() ? "" : " then ") + one;
  }
  return out.empty() ? "nothing (no normalize or resize)" : out;
}

// A teacher must answer the student's inputs with predictions over the student's outputs: a GPT
// for a GPT (the same vocabulary and tokenizer, a context at least the student's block), a
// classifier for a classifier.
void check_teacher(const config::Config& student, const config::Config& teacher,
                   const config::TeacherSpec& spec) {
  const bool lm = student.model_kind == "gpt";
  const std::string at = spec.where + ": teacher " + spec.config;
  if (lm != (teacher.model_kind == "gpt")) {
    throw ConfigError(at + " is a " + teacher.model_kind + " model, the student (" + student.path +
                      ") a " + student.model_kind +
                      ": a language model learns from language models, a classifier from "
                      "classifiers");
  }
  if (!lm) {
    // The teacher runs on the student's batches and test set, preprocessed by the student's
    // [data] augment: a teacher trained on other inputs (normalized where the student's are not)
    // gave soft targets and an accuracy of inputs it never saw, without a word.
    const std::string tp = preprocessing_text(teacher.augment),
                      sp = preprocessing_text(student.augment);
    if (tp != sp) {
      throw ConfigError(at + " was trained on inputs preprocessed by " + tp + ", the student (" +
                        student.path + ") preprocesses its inputs by " + sp +
                        ": the teacher runs on the student's inputs; give both [data] augment "
                        "the same normalize and resize");
    }
    return;
  }
  if (teacher.gpt.vocab_size != student.gpt.vocab_size) {
    throw ConfigError(at + " has vocab_size " + std::to_string(teacher.gpt.vocab_size) +
                      ", the student " + std::to_string(student.gpt.vocab_size) +
                      ": soft targets need the same vocabulary");
  }
  const std::string tid = config::tokenizer_id(*teacher.text_tokenizer),
                    sid = config::tokenizer_id(*student.text_tokenizer);
  if (tid != sid) {
    throw ConfigError(at + " reads text with tokenizer " + tid + ", the student with " + sid +
                      ": the same ids must stand for the same text in both");
  }
  if (teacher.gpt.block_size < student.gpt.block_size) {
    throw ConfigError(at + " has block_size " + std::to_string(teacher.gpt.block_size) +
                      ", shorter than the student's " + std::to_string(student.gpt.block_size) +
                      ": the teacher must read the student's whole window");
  }
}

// Weights alone: a .safetensors file, or a directory holding model.safetensors and no trainer
// state (an export, a PyTorch state dict). "" when `checkpoint` is none of these.
std::string weights_file(const std::string& checkpoint) {
  const std::filesystem::path p(checkpoint);
  if (std::filesystem::is_regular_file(p)) return checkpoint;
  if (std::filesystem::is_regular_file(p / "model.safetensors")) {
    return (p / "model.safetensors").string();
  }
  return "";
}

// A teacher from its checkpoint or weights (loaded strictly, never retrained over), or trained
// from its own config when there is none (and then saved where the checkpoint was expected, so
// the next run loads it).
TeacherOutcome load_or_train_teacher(const config::TeacherSpec& spec, const config::Config& student,
                                     const data::LabelledData& test, int index,
                                     const config::RunLog& log) {
  config::Config tcfg = config::load_config(spec.config);
  tcfg.threads = student.threads;
  check_teacher(student, tcfg, spec);
  TeacherOutcome out{spec.config, spec.checkpoint, spec.weight, false, nullptr, {}};
  const std::string what = "teacher " + std::to_string(index);
  const std::filesystem::path ckpt(spec.checkpoint);
  const bool has_checkpoint =
      !spec.checkpoint.empty() && (std::filesystem::exists(ckpt / "latest") ||
                                   std::filesystem::exists(ckpt / "trainer_state.json"));
  const std::string weights =
      spec.checkpoint.empty() || has_checkpoint ? std::string() : weights_file(spec.checkpoint);
  if (!weights.empty()) {
    tcfg.init_from = weights;
    tcfg.init_strict = true;
    out.model = config::build_model(tcfg);
    if (log) log(what + ": " + tcfg.path + ", weights from " + weights);
    return out;
  }
  if (has_checkpoint) {
    out.model = config::build_model(tcfg);
    config::check_checkpoint_tokenizer(train::load_checkpoint(spec.checkpoint, *out.model, nullptr),
                                       student, what + "'s checkpoint " + spec.checkpoint);
    if (log) log(what + ": " + tcfg.path + " loaded from " + spec.checkpoint);
    return out;
  }
  // Every worker of a multi-worker job would train its own copy and race to save it.
  if (const auto env = comm::gloo_options_from_env(); env && env->world_size > 1) {
    throw ConfigError(spec.where + ": " + what + " (" + spec.config + ") has no checkpoint at \"" +
                      spec.checkpoint +
                      "\": under several workers a teacher must be trained first (hpm train " +
                      spec.config + ") and given by its checkpoint or weights");
  }
  if (!tcfg.backup_dir.empty()) {
    config::refuse_setting(tcfg, "train", "backup_dir",
                           "is not written when hpm distill trains a teacher: give the teacher a "
                           "checkpoint (teacher_checkpoint), or train it first with hpm train");
  }
  Trained t = train_model(tcfg, what, nullptr, test, true, log, "teacher-" + std::to_string(index));
  if (!spec.checkpoint.empty()) {
    const std::string dir =
        train::save_checkpoint(spec.checkpoint, *t.model, *t.optimizer, t.state);
    if (log) log(what + ": saved to " + dir);
  }
  out.model = t.model;
  out.trained = true;
  return out;
}

void check_distillation(const config::Config& cfg) {
  if (!cfg.distill.present || cfg.distill.teachers.empty()) {
    throw ConfigError(cfg.path +
                      ": hpm distill needs a [distill] section with teacher_config (and "
                      "teacher_checkpoint) or teachers = [{config, checkpoint, weight}, ...]");
  }
  config::refuse_train_only_settings(cfg, "hpm distill");
  // One command trains teachers, students and baselines in turn: one backup could not resume it.
  if (!cfg.backup_dir.empty()) {
    config::refuse_setting(cfg, "train", "backup_dir",
                           "is not supported by hpm distill, which backs up none of the runs it "
                           "trains (checkpoint_dir keeps the student's checkpoints)");
  }
  // The teachers run on the student's batches, where the student trains: both on the CPU for now.
  config::refuse_device_but_cpu(cfg, "hpm distill", "its teachers and students train on the CPU");
}

}  // namespace

DistillationOutcome run_distillation(const config::Config& cfg, const config::RunLog& log) {
  check_distillation(cfg);
  // One process group for every model trained here under multi_worker_mirrored (see
  // config::build_strategy); declared first, so it outlives the strategies that use it.
  comm::CommunicatorPtr workers;
  config::use_threads(cfg.threads);
  const data::LabelledData test = config::test_set(cfg);
  const bool lm = cfg.token_source();
  DistillationOutcome out;
  out.chief = chief_process();
  const config::RunLog say = out.chief ? log : config::RunLog();

  // Teachers first: each trained from its own config when it has no checkpoint yet.
  std::vector<Teacher> teachers;
  for (std::size_t i = 0; i < cfg.distill.teachers.size(); ++i) {
    TeacherOutcome t =
        load_or_train_teacher(cfg.distill.teachers[i], cfg, test, static_cast<int>(i), say);
    const EnsembleScore e = evaluate_ensemble({{t.model, 1.0f}}, test, score_batch(cfg));
    t.score = RunScore{e.loss, e.accuracy, 0, t.model->num_parameters()};
    if (say) {
      say(format_line("teacher %zu: %s %.4f, %s %.4f, %lld parameters", i,
                      lm ? "val loss" : "test loss", e.loss, lm ? "token accuracy" : "accuracy",
                      e.accuracy, static_cast<long long>(t.score.parameters)));
    }
    teachers.push_back({t.model, t.weight});
    out.teachers.push_back(std::move(t));
  }
  // Augmented inputs never repeat: caching their targets would only fill memory. Nor do a
  // language model's windows at random starts.
  const DistillOptions options{cfg.distill.alpha, cfg.distill.temperature,
                               cfg.distill.cache_teacher && cfg.augment.empty() && !lm};
  out.cache_targets = options.cache_targets;
  auto distiller = std::make_shared<const Distiller>(teachers, options);
  const EnsembleScore ensemble = evaluate_ensemble(teachers, test, score_batch(cfg));
  out.ensemble = RunScore{ensemble.loss, ensemble.accuracy, 0, 0};

  const std::string what =
      format_line("student (alpha %g, T %g)", cfg.distill.alpha, cfg.distill.temperature);
  Trained student = train_model(cfg, what, distiller, test, true, say, "", &workers);
  out.student = student.model;
  out.student_score = student.score;
  out.cache_hits = distiller->cache_hits();
  out.cache_misses = distiller->cache_misses();
  if (options.cache_targets && say) {
    say(format_line("teacher cache: %lld rows answered from it, %lld run through the teachers",
                    static_cast<long long>(out.cache_hits),
                    static_cast<long long>(out.cache_misses)));
  }
  if (cfg.distill.m_on_m) {
    // M on M: a student per teacher (seeds seed, seed + 1, ...), then the students' ensemble.
    std::vector<std::shared_ptr<nn::Module>> students;
    for (std::size_t i = 0; i < teachers.size(); ++i) {
      config::Config scfg = cfg;
      scfg.seed = cfg.seed + i;
      scfg.checkpoint_dir.clear();
      DistillOptions one = options;
      one.cache_targets = false;  // one pass per teacher: nothing would be reused
      Trained t = train_model(
          scfg, "M on M student " + std::to_string(i),
          std::make_shared<const Distiller>(std::vector<Teacher>{{teachers[i].model, 1.0f}}, one),
          test, false, say, "m-on-m-" + std::to_string(i), &workers);
      out.m_on_m_accuracies.push_back(t.score.accuracy);
      students.push_back(t.model);
    }
    out.m_on_m_accuracy = ensemble_accuracy(students, test);
    if (say) {
      say(format_line("M on M: ensemble of %zu students, test accuracy %.4f", students.size(),
                      *out.m_on_m_accuracy));
    }
  }
  if (!cfg.distill.baseline) {
    if (say) {
      say(format_line("teacher %.4f, distilled student %.4f", ensemble.accuracy,
                      out.student_score.accuracy));
    }
    return out;
  }
  // Same seed: same initial weights and the same batches; only the loss differs.
  const Trained base = train_model(cfg, "baseline student (labels only)", nullptr, test, false, say,
                                   "baseline", &workers);
  out.baseline = base.score;
  const Tensor labels = test.labels.reshape({test.labels.numel()});  // one per row (position)
  const Churn c = churn(predict_logits(*base.model, test.inputs, score_batch(cfg)),
                        predict_logits(*student.model, test.inputs, score_batch(cfg)), labels);
  out.baseline_to_student = c;
  if (say) {
    say(
        format_line("teacher %.4f, distilled student %.4f, baseline student %.4f%s; churn "
                    "baseline -> distilled %.4f (good %.4f, bad %.4f)",
                    ensemble.accuracy, out.student_score.accuracy, base.score.accuracy,
                    lm ? " (token accuracy)" : "", c.churn, c.good_churn, c.bad_churn));
    if (lm) {
      say(format_line("val loss: teachers %.4f, distilled student %.4f, baseline student %.4f",
                      ensemble.loss, out.student_score.loss, base.score.loss));
    }
  }
  return out;
}

nlohmann::json churn_json(const Churn& c) {
  return {{"churn", c.churn},
          {"good_churn", c.good_churn},
          {"bad_churn", c.bad_churn},
          {"examples", c.examples}};
}

nlohmann::json distillation_report(const config::Config& cfg, const DistillationOutcome& o) {
  nlohmann::json teachers = nlohmann::json::array();
  for (const TeacherOutcome& t : o.teachers) {
    teachers.push_back({{"config", t.config},
                        {"checkpoint", t.checkpoint},
                        {"weight", t.weight},
                        {"trained", t.trained},
                        {"parameters", t.score.parameters},
                        {"test_loss", t.score.loss},
                        {"test_accuracy", t.score.accuracy}});
  }
  const bool lm = cfg.token_source();
  nlohmann::json report = {{"teacher_test_accuracy", o.ensemble.accuracy},
                           {"teacher_test_loss", o.ensemble.loss},
                           {"language_model", lm},
                           {"strategy", cfg.strategy},
                           {"max_steps", lm ? nlohmann::json(cfg.max_steps) : nlohmann::json()},
                           {"teachers", teachers},
                           {"student_test_accuracy", o.student_score.accuracy},
                           {"student_test_loss", o.student_score.loss},
                           {"student_seconds", o.student_score.seconds},
                           {"alpha", cfg.distill.alpha},
                           {"temperature", cfg.distill.temperature},
                           {"epochs", cfg.epochs},
                           {"seed", cfg.seed},
                           {"student_parameters", o.student_score.parameters},
                           {"teacher_cache", o.cache_targets},
                           {"teacher_cache_hits", o.cache_hits},
                           {"teacher_cache_misses", o.cache_misses}};
  if (o.m_on_m_accuracy) {
    report["m_on_m_test_accuracy"] = *o.m_on_m_accuracy;
    report["m_on_m_student_test_accuracies"] = o.m_on_m_accuracies;
  }
  if (o.baseline) {
    report["baseline_student_test_accuracy"] = o.baseline->accuracy;
    report["baseline_student_test_loss"] = o.baseline->loss;
    report["baseline_to_student_churn"] = churn_json(*o.baseline_to_student);
  }
  return report;
}

}  // namespace hpm::distill
