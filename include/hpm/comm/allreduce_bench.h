// The all-reduce's time per message size, and its bandwidths as nccl-tests reports them:
// algbw = bytes / time; busbw = algbw * 2(N-1)/N, the traffic each rank's link carries in a
// bandwidth-optimal all-reduce, comparable across world sizes (`hpm bench allreduce`).
#pragma once
#include <cstdint>
#include <vector>

#include "hpm/comm/communicator.h"

namespace hpm::comm {

struct AllreduceTiming {
  std::int64_t bytes = 0;
  double seconds = 0;  // the slowest rank's median
  double algbw_gbps() const { return static_cast<double>(bytes) / seconds / 1e9; }
  double busbw_gbps(int ranks) const { return algbw_gbps() * 2.0 * (ranks - 1) / ranks; }
};

// A collective: every rank of `c` calls it with the same sizes. Each size is all-reduced (f32
// sums) a number of times that shrinks with its size, after two warm-ups, a barrier before each;
// every rank gets the slowest rank's median, what a training step would wait for.
std::vector<AllreduceTiming> time_allreduces(Communicator& c,
                                             const std::vector<std::int64_t>& sizes);

// `world` ranks as threads of this process over the local backend.
std::vector<AllreduceTiming> time_allreduces_on_threads(int world, Algorithm algorithm,
                                                        const std::vector<std::int64_t>& sizes);

// `world` ranks over gloo: this process is rank 0, the others are forked from it, meeting in a
// FileStore in a temporary directory of their own (removed after). A rank that fails says why on
// stderr; rank 0 then throws CommError.
std::vector<AllreduceTiming> time_allreduces_on_processes(int world, Algorithm algorithm,
                                                          const std::vector<std::int64_t>& sizes);

}  // namespace hpm::comm
