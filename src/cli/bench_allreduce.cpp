// `hpm bench allreduce`: time, algorithm bandwidth and bus bandwidth of an all-reduce per message
// size, on the local backend (ranks as threads) or the gloo backend (ranks as processes: forked
// here over a FileStore, or the processes `hpm launch` started).
//
// Bandwidths follow nccl-tests: algbw = bytes / time; busbw = algbw * 2(N-1)/N, the traffic each
// rank's link carries in a bandwidth-optimal all-reduce, comparable across world sizes.
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "hpm/cli/bench.h"
#include "hpm/cli/report.h"
#include "hpm/comm/gloo.h"
#include "hpm/comm/local.h"
#include "hpm/io/atomic_file.h"

namespace hpm::cli {

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t parse_size(const std::string& s) {
  if (s.empty()) throw std::invalid_argument("empty size");
  std::size_t pos = 0;
  const double v = std::stod(s, &pos);
  std::int64_t mult = 1;
  const std::string unit = s.substr(pos);
  if (unit == "K" || unit == "k" || unit == "KiB")
    mult = 1 << 10;
  else if (unit == "M" || unit == "MiB")
    mult = 1 << 20;
  else if (unit == "G" || unit == "GiB")
    mult = std::int64_t{1} << 30;
  else if (!unit.empty() && unit != "B")
    throw std::invalid_argument("size '" + s + "': unit must be K, M or G");
  return static_cast<std::int64_t>(v * static_cast<double>(mult));
}

int iterations_for(std::int64_t bytes) {
  return static_cast<int>(std::clamp<std::int64_t>(
      (std::int64_t{512} << 20) / std::max<std::int64_t>(bytes, 1), 5, 200));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times `iters` all-reduces of `bytes` on this rank (a barrier before each, not timed); returns
// the median seconds per all-reduce.
double time_allreduce(comm::Communicator& c, std::int64_t bytes, int iters) {
  Tensor data = Tensor::full({std::max<std::int64_t>(bytes / 4, 1)}, 1.0f);
  for (int w = 0; w < 2; ++w) c.allreduce(data, comm::ReduceOp::kSum)->wait();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    c.barrier()->wait();
    const auto t0 = Clock::now();
    c.allreduce(data, comm::ReduceOp::kSum)->wait();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  // Each rank's median differs a little; the slowest rank is what a training step waits for.
  Tensor t = Tensor::full({1}, static_cast<float>(median(times)));
  c.allreduce(t, comm::ReduceOp::kMax)->wait();
  return t.item();
}

struct Row {
  std::int64_t bytes;
  double seconds;
};

std::vector<Row> run_rank(comm::Communicator& c, const std::vector<std::int64_t>& sizes) {
  std::vector<Row> rows;
  for (std::int64_t bytes : sizes)
    rows.push_back({bytes, time_allreduce(c, bytes, iterations_for(bytes))});
  return rows;
}

int report(const AllreduceBenchOptions& o, const std::vector<Row>& rows,
           const std::string& algorithm) {
  const int n = o.world;
  std::printf("hpm bench allreduce: backend %s, %d ranks, algorithm %s\n", o.backend.c_str(), n,
              algorithm.c_str());
  std::printf("%12s %12s %14s %14s\n", "bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    const double algbw = static_cast<double>(r.bytes) / r.seconds / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    std::printf("%12lld %12.1f %14.3f %14.3f\n", static_cast<long long>(r.bytes), r.seconds * 1e6,
                algbw, busbw);
    out.push_back(
        {{"bytes", r.bytes}, {"seconds", r.seconds}, {"algbw_gbps", algbw}, {"busbw_gbps", busbw}});
  }
  write_report(o.report,
               {{"backend", o.backend}, {"world", n}, {"algorithm", algorithm}, {"results", out}});
  return 0;
}

int bench_local(const AllreduceBenchOptions& o, const std::vector<std::int64_t>& sizes) {
  auto comms = comm::make_local_group(o.world);
  std::vector<std::vector<Row>> rows(static_cast<std::size_t>(o.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < o.world; ++r) {
    threads.emplace_back([&, r] {
      comms[r]->set_algorithm(comm::algorithm_from_name(o.algorithm));
      rows[static_cast<std::size_t>(r)] = run_rank(*comms[r], sizes);
    });
  }
  for (auto& t : threads) t.join();
  return report(o, rows[0], o.algorithm);
}

// Under `hpm launch`: this process is one rank. Otherwise fork the ranks here.
int bench_gloo(const AllreduceBenchOptions& o, const std::vector<std::int64_t>& sizes) {
  if (auto env = comm::gloo_options_from_env()) {
    auto c = comm::make_gloo_communicator(*env);
    c->set_algorithm(comm::algorithm_from_name(o.algorithm));
    const auto rows = run_rank(*c, sizes);
    if (env->rank != 0) return 0;
    AllreduceBenchOptions shown = o;
    shown.world = env->world_size;
    return report(shown, rows, o.algorithm);
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("hpm-bench-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  std::vector<pid_t> children;
  for (int r = 1; r < o.world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      int status = 0;
      try {
        comm::GlooOptions g{r, o.world, dir};
        auto c = comm::make_gloo_communicator(g);
        c->set_algorithm(comm::algorithm_from_name(o.algorithm));
        run_rank(*c, sizes);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "hpm bench allreduce: rank %d: %s\n", r, e.what());
        status = 1;
      }
      std::fflush(nullptr);
      ::_exit(status);
    }
    children.push_back(pid);
  }
  int rc = 0;
  try {
    comm::GlooOptions g{0, o.world, dir};
    auto c = comm::make_gloo_communicator(g);
    c->set_algorithm(comm::algorithm_from_name(o.algorithm));
    rc = report(o, run_rank(*c, sizes), o.algorithm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hpm bench allreduce: rank 0: %s\n", e.what());
    rc = 1;
  }
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}

}  // namespace

int run_bench_allreduce(const AllreduceBenchOptions& o) {
  std::vector<std::int64_t> sizes;
  std::string rest = o.sizes;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    sizes.push_back(parse_size(rest.substr(0, comma)));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  comm::algorithm_from_name(o.algorithm);  // reject a typo before any rank starts
  if (o.backend == "local") return bench_local(o, sizes);
  if (o.backend == "gloo") return bench_gloo(o, sizes);
  throw std::invalid_argument("--backend must be local or gloo, got '" + o.backend + "'");
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
