#include "hpm/comm/allreduce_bench.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "hpm/comm/gloo.h"
#include "hpm/comm/local.h"

namespace hpm::comm {

namespace {

using Clock = std::chrono::steady_clock;

// About 512 MiB of traffic per size, within 5..200 all-reduces.
int iterations_for(std::int64_t bytes) {
  return static_cast<int>(std::clamp<std::int64_t>(
      (std::int64_t{512} << 20) / std::max<std::int64_t>(bytes, 1), 5, 200));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double time_allreduce(Communicator& c, std::int64_t bytes, int iters) {
  Tensor data = Tensor::full({std::max<std::int64_t>(bytes / 4, 1)}, 1.0f);
  for (int w = 0; w < 2; ++w) c.allreduce(data, ReduceOp::kSum)->wait();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    c.barrier()->wait();
    const auto t0 = Clock::now();
    c.allreduce(data, ReduceOp::kSum)->wait();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  Tensor slowest = Tensor::full({1}, static_cast<float>(median(times)));
  c.allreduce(slowest, ReduceOp::kMax)->wait();
  return slowest.item();
}

}  // namespace

std::vector<AllreduceTiming> time_allreduces(Communicator& c,
                                             const std::vector<std::int64_t>& sizes) {
  std::vector<AllreduceTiming> rows;
  for (const std::int64_t bytes : sizes)
    rows.push_back({bytes, time_allreduce(c, bytes, iterations_for(bytes))});
  return rows;
}

std::vector<AllreduceTiming> time_allreduces_on_threads(int world, Algorithm algorithm,
                                                        const std::vector<std::int64_t>& sizes) {
  auto comms = make_local_group(world);
  std::vector<AllreduceTiming> rows;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      comms[r]->set_algorithm(algorithm);
      auto mine = time_allreduces(*comms[r], sizes);
      if (r == 0) rows = std::move(mine);
    });
  }
  for (auto& t : threads) t.join();
  return rows;
}

std::vector<AllreduceTiming> time_allreduces_on_processes(int world, Algorithm algorithm,
                                                          const std::vector<std::int64_t>& sizes) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("hpm-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto rank_rows = [&](int rank) {
    auto c = make_gloo_communicator(GlooOptions{rank, world, dir.string()});
    c->set_algorithm(algorithm);
    return time_allreduces(*c, sizes);
  };
  std::vector<pid_t> children;
  for (int r = 1; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) break;  // the ranks that did start fail their rendezvous; reported below
    if (pid == 0) {
      int status = 0;
      try {
        rank_rows(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "hpm bench allreduce: rank %d: %s\n", r, e.what());
        status = 1;
      }
      std::fflush(nullptr);
      ::_exit(status);
    }
    children.push_back(pid);
  }
  std::vector<AllreduceTiming> rows;
  std::string failed;
  if (static_cast<int>(children.size()) + 1 != world) failed = "fork failed";
  try {
    if (failed.empty()) rows = rank_rows(0);
  } catch (const std::exception& e) {
    failed = std::string("rank 0: ") + e.what();
  }
  for (const pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if ((!WIFEXITED(status) || WEXITSTATUS(status) != 0) && failed.empty()) {
      failed = "a forked rank failed (see its message above)";
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (!failed.empty()) throw CommError("all-reduce benchmark over gloo: " + failed);
  return rows;
}

}  // namespace hpm::comm
