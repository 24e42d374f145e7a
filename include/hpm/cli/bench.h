// `hpm bench ...`: measurements that need the library's runtime, not a config.
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace hpm::cli {

struct AllreduceBenchOptions {
  std::string backend = "local";  // local | gloo
  int world = 2;
  std::string sizes = "4K,64K,1M,16M,64M,256M";
  std::string algorithm = "auto";
  std::string report;  // JSON file
};

// Adds `hpm bench allreduce` to `app` (the subcommand's App, to test whether it was named).
CLI::App* add_bench_command(CLI::App& app, AllreduceBenchOptions& options);

// Prints one row per size: time, algorithm bandwidth and bus bandwidth. Returns the exit code.
int run_bench_allreduce(const AllreduceBenchOptions& options);

}  // namespace hpm::cli
