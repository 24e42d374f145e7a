// `hpm codistill CONFIG`: flags, then distill::run_codistillation (see codistill_run.h).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "hpm/cli/distill_command.h"
#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/distill/codistill_run.h"
#include "hpm/train/trainer.h"

namespace hpm::cli {

CLI::App* add_codistill_command(CLI::App& app, CodistillCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "codistill", "train CONFIG's [codistill] copies together, distilling from each other");
  add_config_flags(cmd, o.config_path, o.overrides,
                   "TOML run configuration with a [codistill] section", &o.report);
  cmd->add_option("--threads", o.threads, "intra-op threads per copy (default: [train] threads)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--seed", o.seed, "copy 0's seed; copy r gets seed + r (overrides [train] seed)")
      ->check(seed_range());
  return cmd;
}

int run_codistill(const CodistillCommandOptions& o) {
  Config cfg = load_config(o.config_path, o.overrides);
  if (o.threads > 0) cfg.threads = o.threads;
  if (o.seed >= 0) cfg.seed = static_cast<std::uint64_t>(o.seed);
  try {
    const distill::CodistillOutcome r = distill::run_codistillation(cfg);
    if (r.chief) write_report(o.report, distill::codistillation_report(cfg, r));
  } catch (const train::TrainingError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return 3;
  }
  return 0;
}

}  // namespace hpm::cli
