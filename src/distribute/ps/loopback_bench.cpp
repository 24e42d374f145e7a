#include "hpm/distribute/ps/loopback_bench.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "hpm/distribute/ps/client.h"
#include "hpm/distribute/ps/server.h"

namespace hpm::distribute::ps {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::vector<PushPullTiming> time_push_pull(const std::vector<std::int64_t>& sizes, int repeats) {
  Cluster c;
  c.security.token = "bench";
  c.workers = 1;
  c.max_message_bytes = 1u << 30;
  ParameterServer server(c, 0, "127.0.0.1:0");
  c.ps = {"127.0.0.1:" + std::to_string(server.port())};
  std::vector<PushPullTiming> out;
  for (const std::int64_t bytes : sizes) {
    const std::int64_t numel = std::max<std::int64_t>(bytes / 4, 1);
    Tensor v = Tensor::zeros({numel});
    v.set_requires_grad(true);
    nn::NamedTensors vars{{"v", v}};
    PsClient client(c, {"v"}, {numel});
    client.init(vars, OptimizerSpec{}, 0, {0});
    std::vector<double> pull, push;
    const std::vector<Tensor> grads{Tensor::full({numel}, 1e-3f)};
    for (int r = 0; r < repeats + 1; ++r) {  // the first of each is a warm-up
      const auto t0 = Clock::now();
      const auto versions = client.pull(vars);
      const auto t1 = Clock::now();
      client.push(grads, r, 0, versions, 0, 0, 0.01f);
      const auto t2 = Clock::now();
      if (r == 0) continue;
      pull.push_back(std::chrono::duration<double>(t1 - t0).count());
      push.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    out.push_back({bytes, median(pull), median(push), repeats});
  }
  return out;
}

}  // namespace hpm::distribute::ps
