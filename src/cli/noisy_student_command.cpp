// `hpm distill CONFIG` with a [noisy_student] section: Noisy Student self-training rounds.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "hpm/cli/distill_command.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/data/in_memory.h"
#include "hpm/distill/noisy_student.h"
#include "hpm/io/atomic_file.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/random.h"

namespace hpm::cli {

namespace {

// The [train], [memory] and [early_stopping] settings of a Trainer run that the rounds have no
// place for: the teacher and the students train through distill::fit_targets (f32, on target
// distributions, no clipping, the model as built) and write nothing but the report. `outputs`:
// the settings that name files too (not for a teacher_config, which may well be hpm train's).
void refuse_what_noisy_student_ignores(const Config& c, bool outputs) {
  const std::string why =
      "does not reach Noisy Student (its rounds train through distill::fit_targets): remove it";
  if (c.precision != "f32") refuse_setting(c, "train", "precision", why);
  if (c.clip_grad_norm != 0.0f) refuse_setting(c, "train", "clip_grad_norm", why);
  if (c.label_smoothing != 0.0f) refuse_setting(c, "train", "label_smoothing", why);
  if (c.accumulation_steps != 1) refuse_setting(c, "train", "accumulation_steps", why);
  if (c.recompute != "never") refuse_setting(c, "memory", "recompute", why);
  if (c.offload) refuse_setting(c, "memory", "offload", why);
  if (c.device_budget_mb > 0) refuse_setting(c, "memory", "device_budget_mb", why);
  if (c.early_stopping) refuse_setting(c, "early_stopping", "", why);
  if (!outputs) return;
  const std::pair<const char*, const std::string*> files[] = {
      {"checkpoint_dir", &c.checkpoint_dir},
      {"backup_dir", &c.backup_dir},
      {"best_checkpoint_dir", &c.best_checkpoint_dir},
      {"metrics_csv", &c.metrics_csv},
      {"tensorboard_dir", &c.tensorboard_dir}};
  for (const auto& [key, value] : files)
    if (!value->empty()) refuse_setting(c, "train", key, why);
}

}  // namespace

int run_noisy_student(const Config& cfg, const std::string& report_path) {
  const NoisyStudentSection& ns = cfg.noisy_student;
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
  const Config tcfg = ns.teacher_config.empty() ? cfg : load_config(ns.teacher_config);
  if (!ns.teacher_config.empty()) refuse_what_noisy_student_ignores(tcfg, false);
  use_threads(cfg.threads);

  // The split: the first `labelled` training rows keep their labels; the rest lose them. The test
  // set is only ever evaluated on.
  const data::LabelledData all =
      data::load_mnist_split(cfg.data_dir, "train").first(cfg.train_limit);
  const std::int64_t n = all.size();
  const std::int64_t n_labelled =
      ns.labelled > 0 ? ns.labelled
                      : static_cast<std::int64_t>(static_cast<double>(n) * ns.labelled_fraction);
  if (n_labelled <= 0 || n_labelled >= n) {
    throw ConfigError(cfg.path + ": [noisy_student] needs 0 < labelled rows (" +
                      std::to_string(n_labelled) + ") < training rows (" + std::to_string(n) + ")");
  }
  const data::LabelledData labelled = all.first(n_labelled);
  const Tensor unlabelled = all.inputs.narrow(n_labelled, n - n_labelled);
  const data::LabelledData test = test_set(cfg);

  // The noise: random crop of the padded image and horizontal flip (and the model's dropout).
  std::vector<data::AugmentOp> noise;
  if (ns.crop_padding > 0) {
    data::AugmentOp crop;
    crop.op = "random_crop";
    crop.padding = ns.crop_padding;
    crop.height = all.inputs.size(2);
    crop.width = all.inputs.size(3);
    noise.push_back(crop);
  }
  if (ns.flip) noise.push_back(data::AugmentOp{"random_flip", 0, 0, 0, {}, {}});

  // The first teacher: trained on the labelled rows alone, under the same noise.
  manual_seed(cfg.seed);
  std::shared_ptr<nn::Module> teacher = build_model(tcfg);
  // The number of classes: the model's outputs.
  const std::int64_t classes = distill::predict_logits(*teacher, all.inputs.narrow(0, 1)).size(1);
  {
    auto opt = build_optimizer(tcfg, *teacher);
    distill::TargetFitOptions fit;
    fit.epochs = ns.teacher_epochs > 0 ? ns.teacher_epochs : tcfg.epochs;
    fit.batch_size = tcfg.batch_size;
    fit.seed = cfg.seed;
    fit.augment = noise;
    fit.schedule = build_schedule(tcfg);
    std::printf("noisy student: %lld labelled rows, %lld unlabelled; teacher (%s) %lld epoch(s)\n",
                static_cast<long long>(n_labelled), static_cast<long long>(n - n_labelled),
                tcfg.path.c_str(), static_cast<long long>(fit.epochs));
    std::fflush(stdout);
    distill::fit_targets(*teacher, *opt, labelled.inputs,
                         distill::one_hot(labelled.labels, classes), fit);
  }
  const double teacher_acc = distill::ensemble_accuracy({teacher}, test);
  std::printf("round 0 (teacher on labelled rows only): test accuracy %.4f\n", teacher_acc);
  std::fflush(stdout);

  distill::NoisyStudentOptions options;
  options.rounds = static_cast<int>(ns.rounds);
  options.pseudo.kind = ns.pseudo_labels == "hard" ? distill::PseudoLabelKind::kHard
                                                   : distill::PseudoLabelKind::kSoft;
  options.pseudo.confidence_threshold = ns.confidence_threshold;
  options.pseudo.balance_classes = ns.balance_classes;
  options.pseudo.per_class = ns.per_class;
  options.fit.epochs = cfg.epochs;
  options.fit.batch_size = cfg.batch_size;
  options.fit.seed = cfg.seed;
  options.fit.augment = noise;
  options.fit.schedule = build_schedule(cfg);
  distill::StudentFactory student{[&] { return std::shared_ptr<nn::Module>(build_model(cfg)); },
                                  [&](nn::Module& m) { return build_optimizer(cfg, m); }};

  nlohmann::json rounds = nlohmann::json::array();
  const auto history = distill::noisy_student(
      teacher, student, labelled, unlabelled, &test, options,
      [&](const distill::NoisyStudentRound& r) {
        std::printf("round %d: %lld pseudo-labelled rows, student test accuracy %.4f\n", r.round,
                    static_cast<long long>(r.pseudo_labelled), r.test_accuracy);
        std::fflush(stdout);
        rounds.push_back({{"round", r.round},
                          {"pseudo_labelled", r.pseudo_labelled},
                          {"test_accuracy", r.test_accuracy}});
      });
  nlohmann::json report = {
      {"method", "noisy_student"},
      {"teacher_test_accuracy", teacher_acc},
      {"student_test_accuracy", history.back().test_accuracy},
      {"rounds", rounds},
      {"labelled", n_labelled},
      {"unlabelled", n - n_labelled},
      {"pseudo_labels", ns.pseudo_labels},
      {"confidence_threshold", ns.confidence_threshold},
      {"balance_classes", ns.balance_classes},
      {"crop_padding", ns.crop_padding},
      {"flip", ns.flip},
      {"epochs", cfg.epochs},
      {"teacher_epochs", ns.teacher_epochs > 0 ? ns.teacher_epochs : tcfg.epochs},
      {"seed", cfg.seed},
      {"student_parameters", history.back().student->num_parameters()},
      {"teacher_parameters", teacher->num_parameters()}};
  write_report(report_path, report);
  return 0;
}

}  // namespace hpm::cli
