// The flags of the commands that run a configuration as it is (train, evaluate, data bench): the
// config and its --set, --report, --threads, --seed and --device; and the configuration they
// make together.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hpm/cli/run_config.h"

namespace CLI {
class App;
}

namespace hpm::cli {

struct Common {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string report;
  int threads = 0;
  std::int64_t seed = -1;
  std::string device;
};

// Adds them to `cmd`. `config_required` false: a command that can take the configuration a
// checkpoint recorded.
void add_common(CLI::App* cmd, Common& c, bool config_required = true);

// The command's configuration: its config file with --set and --device applied; or, for a command
// reading `checkpoint` or `weights`, the one they recorded when no file is given
// (config_for_checkpoint, config_for_weights). Sets the process's threads (use_threads).
Config configure(const Common& c, const std::string& checkpoint = "",
                 const std::string& weights = "");

}  // namespace hpm::cli
