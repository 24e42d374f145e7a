// An in-process parameter-server cluster for tests: P servers and a coordinator on free loopback
// ports, W workers on threads, all on one small model and data set.
#pragma once
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "hpm/distribute/ps/coordinator.h"
#include "hpm/distribute/ps/server.h"
#include "hpm/distribute/ps/worker.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm::distribute::ps::testing {

inline std::shared_ptr<nn::Module> small_model(std::uint64_t seed = 5) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(12, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 4)});
}

// n rows of 12 features; the label is the argmax of the first four features (learnable).
inline data::LabelledData small_data(std::int64_t n, std::uint64_t seed = 9) {
  Generator gen(seed);
  data::LabelledData d{Tensor::randn({n, 12}, gen), Tensor::zeros({n}, DType::I64)};
  const float* x = d.inputs.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    int best = 0;
    for (int k = 1; k < 4; ++k)
      if (x[i * 12 + k] > x[i * 12 + best]) best = k;
    d.labels.data<std::int64_t>()[i] = best;
  }
  return d;
}

inline Cluster loopback_cluster(int workers) {
  Cluster c;
  c.workers = workers;
  c.security.token = "test-token-0123456789";
  c.rpc_timeout = std::chrono::seconds(10);
  return c;
}

// Starts `ps_tasks` servers, filling cluster.ps.
inline std::vector<std::unique_ptr<ParameterServer>> start_servers(Cluster& cluster, int ps_tasks) {
  std::vector<std::unique_ptr<ParameterServer>> servers;
  cluster.ps.clear();
  for (int t = 0; t < ps_tasks; ++t) {
    servers.push_back(std::make_unique<ParameterServer>(cluster, t, "127.0.0.1:0"));
    cluster.ps.push_back("127.0.0.1:" + std::to_string(servers.back()->port()));
  }
  return servers;
}

struct RunResult {
  CoordinatorReport report;
  std::vector<WorkerReport> workers;
  std::vector<float> params;   // the coordinator's model after training, flattened
  std::vector<float> buffers;  // its running statistics (F32 buffers), as the servers hold them
};

inline std::vector<float> flat(const nn::NamedTensors& vars) {
  std::vector<float> out;
  for (const auto& [name, t] : vars) {
    auto v = t.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// A model's F32 buffers (BatchNorm's running statistics) flattened, in ps_variables' order.
inline std::vector<float> flat_buffers(const nn::Module& m) {
  nn::NamedTensors buffers;
  for (const auto& [name, t] : ps_variables(m))
    if (is_buffer_variable(name)) buffers.emplace_back(name, t);
  return flat(buffers);
}

// Runs a whole job; worker w's options from `worker_options(w)`.
// `make_model` builds each copy alike (it seeds the default generator itself).
template <typename WorkerOptionsFn>
RunResult run_job(
    Cluster cluster, CoordinatorOptions co, const data::LabelledData& data,
    WorkerOptionsFn worker_options,
    const std::function<std::shared_ptr<nn::Module>()>& make_model = [] { return small_model(); }) {
  auto chief_model = make_model();
  nn::NamedTensors vars = ps_variables(*chief_model);
  Coordinator coordinator(cluster, co, vars, "127.0.0.1:0");
  cluster.coordinator = "127.0.0.1:" + std::to_string(coordinator.port());
  RunResult r;
  r.workers.resize(static_cast<std::size_t>(cluster.workers));
  std::vector<std::shared_ptr<nn::Module>> models;  // built here: manual_seed is process-wide
  for (int w = 0; w < cluster.workers; ++w) models.push_back(make_model());
  std::vector<std::thread> threads;
  for (int w = 0; w < cluster.workers; ++w) {
    threads.emplace_back([&, w] {
      Worker worker(cluster, models[static_cast<std::size_t>(w)], data, worker_options(w));
      r.workers[static_cast<std::size_t>(w)] = worker.run();
    });
  }
  r.report = coordinator.run();
  for (auto& t : threads) t.join();
  // The final variables as the servers hold them.
  std::vector<std::string> names;
  std::vector<std::int64_t> numels;
  for (const auto& [n, t] : vars) {
    names.push_back(n);
    numels.push_back(t.numel());
  }
  PsClient(cluster, names, numels).pull(vars);  // into chief_model's own tensors
  r.params = flat(chief_model->named_parameters());
  r.buffers = flat_buffers(*chief_model);
  return r;
}

}  // namespace hpm::distribute::ps::testing
