// The [strategy] and [pipeline] sections and where this process stands among the workers, turned
// into a distribute::Strategy.
#pragma once
#include <memory>
#include <string>

#include "hpm/comm/communicator.h"
#include "hpm/config/config.h"
#include "hpm/distribute/strategy.h"

namespace hpm::config {

// Where this process stands among the workers of a multi-worker job: from `hpm train --rank R
// --world-size W --rendezvous HOST:PORT|DIR`, else from the environment `hpm launch` or `mpirun`
// sets (see comm::gloo_options_from_env).
struct WorkerFlags {
  int rank = -1;
  int world_size = 0;
  std::string rendezvous;
  std::string hostname;  // the address this worker's gloo device binds to (default 127.0.0.1)
};

// Null for one_device (the Trainer then runs the model on the calling thread). Throws
// ConfigError when multi_worker_mirrored has no way to find its peers.
//
// `workers`, when given, is the process group of a command that trains several models in turn
// (distill's student, then its baseline): made at the first multi-worker strategy, reused by the
// next. A second rendezvous at the launcher's address would meet the first one's store (rank 0's
// port still bound, its keys still there) and fail or hang.
std::shared_ptr<distribute::Strategy> build_strategy(const Config& cfg, const WorkerFlags& flags,
                                                     comm::CommunicatorPtr* workers = nullptr);

}  // namespace hpm::config
