// `hpm ps ROLE CONFIG`: one task of a parameter-server job ([cluster] and [ps] in the config).
//   hpm ps serve CONFIG --task I     parameter-server task I (until the coordinator ends the job)
//   hpm ps coordinator CONFIG        the chief: initializes the shards, schedules, evaluates
//   hpm ps worker CONFIG --task I    worker I
//   hpm ps run CONFIG                the role `hpm launch --ps P --workers W` gave this process
//   hpm ps bench                     push and pull throughput over loopback
// The token comes from [cluster] token_file or HPM_PS_TOKEN; the launcher's HPM_PS_CLUSTER
// ({"coordinator": "HOST:PORT", "ps": ["HOST:PORT", ...], "workers": W}) replaces the addresses.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hpm::cli {

struct PsCommandOptions {
  std::string role;  // serve | coordinator | worker | run
  std::string config_path;
  std::vector<std::string> overrides;
  std::string report;
  int task = -1;
  int threads = 0;
  std::int64_t seed = -1;
  // bench
  std::string sizes = "1M,64M";
  int repeats = 5;
};

// Adds `ps` and its subcommands; returns the `ps` command (parsed when any subcommand ran).
CLI::App* add_ps_command(CLI::App& app, PsCommandOptions& options);
// Exit codes: 0 done, 1 bad input or a lost peer (thrown), 3 a non-finite loss.
int run_ps_command(const PsCommandOptions& options);

}  // namespace hpm::cli
