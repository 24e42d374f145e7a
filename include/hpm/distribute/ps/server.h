// One parameter-server task: holds its shard of the variables and their optimizer state, serves
// pulls, applies pushed gradients (every push at once, or one averaged update per synchronous
// step), and saves its shard for the coordinator's checkpoints.
//
//   ps::ParameterServer server(cluster, /*task=*/0, "127.0.0.1:0");
//   server.port();  // the port picked
//   server.wait();  // until a Shutdown call (the coordinator's, at the end) or shutdown()
//
// Every call must carry the cluster's token; malformed or oversized requests are refused with
// INVALID_ARGUMENT or RESOURCE_EXHAUSTED and the server keeps serving.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "hpm/distribute/ps/cluster.h"

namespace hpm::distribute::ps {

struct ServerCounters {
  std::int64_t version = 0;     // updates applied
  std::int64_t pushes = 0;      // accepted pushes
  std::int64_t duplicates = 0;  // pushes of a task already applied (at-least-once re-sends)
  std::int64_t refused = 0;     // calls refused (token, malformed)
};

class ParameterServer {
 public:
  // Listens on `address` (its host is replaced by cluster.bind; port 0: a free one). PsError when
  // it cannot.
  ParameterServer(const Cluster& cluster, int task, const std::string& address);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  int port() const;
  ServerCounters counters() const;
  void wait();
  void shutdown();

 private:
  class Service;
  std::unique_ptr<Service> service_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpm::distribute::ps
