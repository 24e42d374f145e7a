#include "hpm/distill/noisy_student_run.h"

#include <string>
#include <utility>

#include "hpm/config/datasets.h"
#include "hpm/data/in_memory.h"
#include "hpm/distill/distiller.h"
#include "hpm/tensor/random.h"

namespace hpm::distill {

namespace {

using config::ConfigError;
using config::format_line;

// The [train], [memory] and [early_stopping] settings of a Trainer run that the rounds have no
// place for: the teacher and the students train through distill::fit_targets (f32, on target
// distributions, no clipping, the model as built) and write nothing but the report. `outputs`:
// the settings that name files too (not for a teacher_config, which may well be hpm train's).
void refuse_what_noisy_student_ignores(const config::Config& c, bool outputs) {
  const std::string why =
      "does not reach Noisy Student (its rounds train through distill::fit_targets): remove it";
  if (c.precision != "f32") config::refuse_setting(c, "train", "precision", why);
  if (c.clip_grad_norm != 0.0f) config::refuse_setting(c, "train", "clip_grad_norm", why);
  if (c.label_smoothing != 0.0f) config::refuse_setting(c, "train", "label_smoothing", why);
  if (c.accumulation_steps != 1) config::refuse_setting(c, "train", "accumulation_steps", why);
  if (c.recompute != "never") config::refuse_setting(c, "memory", "recompute", why);
  if (c.offload) config::refuse_setting(c, "memory", "offload", why);
  if (c.device_budget_mb > 0) config::refuse_setting(c, "memory", "device_budget_mb", why);
  if (c.early_stopping) config::refuse_setting(c, "early_stopping", "", why);
  // Each was ignored without a word: the rounds trained on the rows as stored while the test set
  // went through augment's normalize; a warmup of N steps ran as N epochs; the rounds ran on the
  // CPU whatever the device said.
  if (!c.augment.empty()) {
    config::refuse_setting(c, "data", "augment",
                           "does not reach Noisy Student, whose rounds train on the rows as "
                           "stored with their own noise ([noisy_student] crop_padding, flip): "
                           "remove it");
  }
  if (c.schedule_unit == "step") {
    config::refuse_setting(c, "schedule", "unit",
                           "= \"step\" is not honoured by Noisy Student, whose rounds set the "
                           "learning rate once an epoch: use unit = \"epoch\"");
  }
  config::refuse_device_but_cpu(c, "Noisy Student", "its rounds train on the CPU");
  if (!outputs) return;
  const std::pair<const char*, const std::string*> files[] = {
      {"checkpoint_dir", &c.checkpoint_dir},
      {"backup_dir", &c.backup_dir},
      {"best_checkpoint_dir", &c.best_checkpoint_dir},
      {"metrics_csv", &c.metrics_csv},
      {"tensorboard_dir", &c.tensorboard_dir}};
  for (const auto& [key, value] : files)
    if (!value->empty()) config::refuse_setting(c, "train", key, why);
}

// The noise: random crop of the padded image and horizontal flip (and the model's dropout).
std::vector<data::AugmentOp> noise_of(const config::NoisyStudentSection& ns, const Tensor& images) {
  std::vector<data::AugmentOp> noise;
  if (ns.crop_padding > 0) {
    data::AugmentOp crop;
    crop.op = "random_crop";
    crop.padding = ns.crop_padding;
    crop.height = images.size(2);
    crop.width = images.size(3);
    noise.push_back(crop);
  }
  if (ns.flip) noise.push_back(data::AugmentOp{"random_flip", 0, 0, 0, {}, {}});
  return noise;
}

}  // namespace

NoisyStudentOutcome run_noisy_student(const config::Config& cfg, const config::RunLog& log) {
  const config::NoisyStudentSection& ns = cfg.noisy_student;
  if (cfg.strategy != "one_device") {
    throw ConfigError(cfg.path + ": [strategy] kind must be one_device for Noisy Student");
  }
  if (cfg.source != "idx") {
    throw ConfigError(cfg.path +
                      ": [noisy_student] reads the [data] dir's IDX files (source = "
                      "\"idx\"), got source \"" +
                      cfg.source + "\"");
  }
  refuse_what_noisy_student_ignores(cfg, true);
  // The first teacher's config (the config's own [model] when none is named).
  const config::Config tcfg =
      ns.teacher_config.empty() ? cfg : config::load_config(ns.teacher_config);
  if (!ns.teacher_config.empty()) refuse_what_noisy_student_ignores(tcfg, false);
  config::use_threads(cfg.threads);

  // The split: the first `labelled` training rows keep their labels; the rest lose them. The test
  // set is only ever evaluated on.
  const data::LabelledData all =
      data::load_mnist_split(cfg.data_dir, "train").first(cfg.train_limit);
  const std::int64_t n = all.size();
  NoisyStudentOutcome out;
  out.labelled = ns.labelled > 0
                     ? ns.labelled
                     : static_cast<std::int64_t>(static_cast<double>(n) * ns.labelled_fraction);
  if (out.labelled <= 0 || out.labelled >= n) {
    throw ConfigError(cfg.path + ": [noisy_student] needs 0 < labelled rows (" +
                      std::to_string(out.labelled) + ") < training rows (" + std::to_string(n) +
                      ")");
  }
  out.unlabelled = n - out.labelled;
  const data::LabelledData labelled = all.first(out.labelled);
  const Tensor unlabelled = all.inputs.narrow(out.labelled, out.unlabelled);
  const data::LabelledData test = config::test_set(cfg);
  const std::vector<data::AugmentOp> noise = noise_of(ns, all.inputs);

  // The first teacher: trained on the labelled rows alone, under the same noise.
  manual_seed(cfg.seed);
  out.teacher = config::build_model(tcfg);
  const std::int64_t classes = predict_logits(*out.teacher, all.inputs.narrow(0, 1)).size(1);
  out.teacher_epochs = ns.teacher_epochs > 0 ? ns.teacher_epochs : tcfg.epochs;
  {
    auto opt = config::build_optimizer(tcfg, *out.teacher);
    TargetFitOptions fit;
    fit.epochs = out.teacher_epochs;
    fit.batch_size = tcfg.batch_size;
    fit.seed = cfg.seed;
    fit.augment = noise;
    fit.schedule = config::build_schedule(tcfg);
    if (log) {
      log(
          format_line("noisy student: %lld labelled rows, %lld unlabelled; teacher (%s) %lld "
                      "epoch(s)",
                      static_cast<long long>(out.labelled), static_cast<long long>(out.unlabelled),
                      tcfg.path.c_str(), static_cast<long long>(fit.epochs)));
    }
    fit_targets(*out.teacher, *opt, labelled.inputs, one_hot(labelled.labels, classes), fit);
  }
  out.teacher_accuracy = ensemble_accuracy({out.teacher}, test);
  if (log) {
    log(format_line("round 0 (teacher on labelled rows only): test accuracy %.4f",
                    out.teacher_accuracy));
  }

  NoisyStudentOptions options;
  options.rounds = static_cast<int>(ns.rounds);
  options.pseudo.kind =
      ns.pseudo_labels == "hard" ? PseudoLabelKind::kHard : PseudoLabelKind::kSoft;
  options.pseudo.confidence_threshold = ns.confidence_threshold;
  options.pseudo.balance_classes = ns.balance_classes;
  options.pseudo.per_class = ns.per_class;
  options.fit.epochs = cfg.epochs;
  options.fit.batch_size = cfg.batch_size;
  options.fit.seed = cfg.seed;
  options.fit.augment = noise;
  options.fit.schedule = config::build_schedule(cfg);
  StudentFactory student{[&] { return std::shared_ptr<nn::Module>(config::build_model(cfg)); },
                         [&](nn::Module& m) { return config::build_optimizer(cfg, m); }};
  out.rounds = noisy_student(
      out.teacher, student, labelled, unlabelled, &test, options, [&](const NoisyStudentRound& r) {
        if (!log) return;
        log(
            format_line("round %d: %lld pseudo-labelled rows, student test accuracy "
                        "%.4f",
                        r.round, static_cast<long long>(r.pseudo_labelled), r.test_accuracy));
      });
  return out;
}

nlohmann::json noisy_student_report(const config::Config& cfg, const NoisyStudentOutcome& o) {
  const config::NoisyStudentSection& ns = cfg.noisy_student;
  nlohmann::json rounds = nlohmann::json::array();
  for (const NoisyStudentRound& r : o.rounds) {
    rounds.push_back({{"round", r.round},
                      {"pseudo_labelled", r.pseudo_labelled},
                      {"test_accuracy", r.test_accuracy}});
  }
  return {{"method", "noisy_student"},
          {"teacher_test_accuracy", o.teacher_accuracy},
          {"student_test_accuracy", o.rounds.back().test_accuracy},
          {"rounds", rounds},
          {"labelled", o.labelled},
          {"unlabelled", o.unlabelled},
          {"pseudo_labels", ns.pseudo_labels},
          {"confidence_threshold", ns.confidence_threshold},
          {"balance_classes", ns.balance_classes},
          {"crop_padding", ns.crop_padding},
          {"flip", ns.flip},
          {"epochs", cfg.epochs},
          {"teacher_epochs", o.teacher_epochs},
          {"seed", cfg.seed},
          {"student_parameters", o.rounds.back().student->num_parameters()},
          {"teacher_parameters", o.teacher->num_parameters()}};
}

}  // namespace hpm::distill
