// A client of every parameter-server task at once: variables are placed on the tasks by size
// (ps::place_variables), and each call goes to all tasks in parallel, each with the cluster's
// deadline and token. Failures throw PsError naming the task's address and the gRPC status.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpm/distribute/ps/cluster.h"
#include "hpm/nn/module.h"

namespace hpm::distribute::ps {

struct OptimizerSpec {
  std::string kind = "sgd";  // sgd | adam | adamw
  float lr = 0.01f, momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  bool amsgrad = false;
};

struct ShardSave {
  std::string file;
  std::uint32_t crc32c = 0;
  std::int64_t version = 0;
};

struct ShardStatus {
  bool reachable = false;
  std::string error;  // why not, when unreachable
  bool initialized = false;
  std::int64_t version = 0, incarnation = 0, pushes = 0, duplicates = 0;
  bool refused = false;  // it answered, refusing the call's token (UNAUTHENTICATED): will recur
};

struct PushOutcome {
  std::int64_t staleness = 0;  // the largest over the tasks
  bool duplicate = false;      // some task had applied it already
};

// What a model keeps on the parameter servers: its parameters (named_parameters' order), then its
// F32 buffers under kBufferPrefix (integer ones, BatchNorm's num_batches_tracked, stay local). The
// tensors are the model's own, so a pull into them updates the model. The coordinator and every
// worker must list the same variables: both call this.
nn::NamedTensors ps_variables(const nn::Module& model);

class PsClient {
 public:
  // `names`, `numels`: the model's variables in order (placement is computed from the sizes).
  PsClient(const Cluster& cluster, const std::vector<std::string>& names,
           const std::vector<std::int64_t>& numels);
  ~PsClient();
  int tasks() const;
  int task_of(std::size_t variable) const { return placement_[variable]; }

  // Gives every task its variables (`vars` in the constructor's order) and optimizer (state
  // optional: names as Optimizer::state(), "step" as a float), starting at `versions[task]`.
  void init(const nn::NamedTensors& vars, const OptimizerSpec& optimizer, int sync_parts,
            const std::vector<std::int64_t>& versions,
            const nn::NamedTensors& optimizer_state = {});
  // Copies every variable into `into` (same order); returns each task's version.
  std::vector<std::int64_t> pull(nn::NamedTensors& into);
  // Pushes `grads` (same order; one per variable) for one task of work.
  PushOutcome push(const std::vector<Tensor>& grads, std::int64_t task, int worker,
                   const std::vector<std::int64_t>& base_versions, std::int64_t step, int part,
                   float lr);
  std::vector<ShardSave> save(const std::string& dir);
  std::vector<ShardStatus> status(std::chrono::milliseconds timeout);
  // Asks every task to exit (best effort: failures are ignored).
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<int> placement_;
  std::vector<std::string> names_;
};

}  // namespace hpm::distribute::ps
