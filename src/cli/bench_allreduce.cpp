// `hpm bench allreduce`: time, algorithm bandwidth and bus bandwidth of an all-reduce per message
// size (comm/allreduce_bench.h), on the local backend (ranks as threads) or the gloo backend
// (ranks as processes: forked here, or the processes `hpm launch` started).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "hpm/cli/bench.h"
#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/comm/allreduce_bench.h"
#include "hpm/comm/gloo.h"

namespace hpm::cli {

namespace {

void print(const AllreduceBenchOptions& o, int world,
           const std::vector<comm::AllreduceTiming>& rows) {
  std::printf("hpm bench allreduce: backend %s, %d ranks, algorithm %s\n", o.backend.c_str(), world,
              o.algorithm.c_str());
  std::printf("%12s %12s %14s %14s\n", "bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  nlohmann::json out = nlohmann::json::array();
  for (const comm::AllreduceTiming& r : rows) {
    std::printf("%12lld %12.1f %14.3f %14.3f\n", static_cast<long long>(r.bytes), r.seconds * 1e6,
                r.algbw_gbps(), r.busbw_gbps(world));
    out.push_back({{"bytes", r.bytes},
                   {"seconds", r.seconds},
                   {"algbw_gbps", r.algbw_gbps()},
                   {"busbw_gbps", r.busbw_gbps(world)}});
  }
  write_report(
      o.report,
      {{"backend", o.backend}, {"world", world}, {"algorithm", o.algorithm}, {"results", out}});
}

}  // namespace

int run_bench_allreduce(const AllreduceBenchOptions& o) {
  const std::vector<std::int64_t> sizes = parse_byte_sizes(o.sizes);
  const comm::Algorithm algorithm = comm::algorithm_from_name(o.algorithm);  // before any rank
  if (o.backend == "local") {
    print(o, o.world, comm::time_allreduces_on_threads(o.world, algorithm, sizes));
  } else if (o.backend != "gloo") {
    throw std::invalid_argument("--backend must be local or gloo, got '" + o.backend + "'");
  } else if (const auto env = comm::gloo_options_from_env()) {
    // Under `hpm launch`: this process is one rank; rank 0 prints.
    auto c = comm::make_gloo_communicator(*env);
    c->set_algorithm(algorithm);
    const auto rows = comm::time_allreduces(*c, sizes);
    if (env->rank == 0) print(o, env->world_size, rows);
  } else {
    print(o, o.world, comm::time_allreduces_on_processes(o.world, algorithm, sizes));
  }
  return 0;
}

CLI::App* add_bench_command(CLI::App& app, AllreduceBenchOptions& o) {
  CLI::App* perf_cmd = app.add_subcommand("bench", "measure the runtime's building blocks");
  perf_cmd->require_subcommand(1);
  CLI::App* cmd =
      perf_cmd->add_subcommand("allreduce", "all-reduce time and bandwidth per message size");
  cmd->add_option("--backend", o.backend, "local (threads) or gloo (processes)")
      ->check(CLI::IsMember({"local", "gloo"}));
  cmd->add_option("--world", o.world, "ranks (gloo: forked here unless under hpm launch)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--sizes", o.sizes, "comma-separated message sizes (K, M, G suffixes)");
  cmd->add_option("--algorithm", o.algorithm, "auto, direct, ring or recursive_doubling");
  cmd->add_option("--report", o.report, "write the results as JSON");
  return cmd;
}

}  // namespace hpm::cli
