#include "hpm/cli/distill_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/config/training_run.h"
#include "hpm/distill/codistill.h"
#include "hpm/distill/distill_run.h"
#include "hpm/distill/noisy_student_run.h"
#include "hpm/train/trainer.h"

namespace hpm::cli {

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
  Config cfg = load_config(o.config_path, o.overrides);
  if (o.threads > 0) cfg.threads = o.threads;
  if (o.seed >= 0) cfg.seed = static_cast<std::uint64_t>(o.seed);
  try {
    if (cfg.noisy_student.present) {
      const distill::NoisyStudentOutcome r = distill::run_noisy_student(cfg);
      write_report(o.report, distill::noisy_student_report(cfg, r));
      return 0;
    }
    const distill::DistillationOutcome r = distill::run_distillation(cfg);
    if (r.chief) write_report(o.report, distill::distillation_report(cfg, r));
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
  std::printf(
      "churn %.4f (good %.4f: A wrong, B right; bad %.4f: A right, B wrong) on %lld test "
      "examples; accuracy A %.4f, B %.4f\n",
      c.churn, c.good_churn, c.bad_churn, static_cast<long long>(c.examples), s.accuracy[0],
      s.accuracy[1]);
  nlohmann::json report = distill::churn_json(c);
  report["accuracy_a"] = s.accuracy[0];
  report["accuracy_b"] = s.accuracy[1];
  report["checkpoint_a"] = o.checkpoint_a;
  report["checkpoint_b"] = o.checkpoint_b;
  write_report(o.report, report);
  return 0;
}

}  // namespace hpm::cli
