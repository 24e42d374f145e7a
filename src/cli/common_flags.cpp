#include "hpm/cli/common_flags.h"

#include <CLI/CLI.hpp>

#include "hpm/cli/options.h"

namespace hpm::cli {

void add_common(CLI::App* cmd, Common& c, bool config_required) {
  add_config_flags(cmd, c.config_path, c.overrides, "TOML run configuration", &c.report,
                   !config_required);
  cmd->add_option("--threads", c.threads, "intra-op threads (default: [train] threads, else 1)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--seed", c.seed, "random seed (overrides [train] seed)")->check(seed_range());
  cmd->add_option("--device", c.device,
                  "where to run: cpu, cuda or cuda:N (overrides [train] device)");
}

Config configure(const Common& c, const std::string& checkpoint, const std::string& weights) {
  std::vector<std::string> overrides = c.overrides;
  if (!c.device.empty()) overrides.push_back("train.device=" + c.device);  // after --set: it wins
  Config cfg = !checkpoint.empty() ? config_for_checkpoint(c.config_path, checkpoint, overrides)
               : !weights.empty()  ? config_for_weights(c.config_path, weights, overrides)
                                   : load_config(c.config_path, overrides);
  if (c.threads > 0) cfg.threads = c.threads;
  if (c.seed >= 0) cfg.seed = static_cast<std::uint64_t>(c.seed);
  use_threads(cfg.threads);
  return cfg;
}

}  // namespace hpm::cli
