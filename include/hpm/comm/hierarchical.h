// A two-level group: `local_size` ranks as threads of this process (the local backend) on top of
// a process-level communicator (gloo). An all-reduce reduces inside the process first, then one
// thread per process reduces across processes, then the result is shared inside the process
// again: the cross-process traffic is one message per process, whatever the local replicas.
// Global rank = process rank * local_size + local rank.
#pragma once
#include <vector>

#include "hpm/comm/communicator.h"

namespace hpm::comm {

// One communicator per local rank. `processes` is used only by local rank 0's communicator.
// send/recv are not offered across the two levels (std::logic_error): pipeline stages use the
// process-level communicator directly.
std::vector<CommunicatorPtr> make_hierarchical_group(
    CommunicatorPtr processes, int local_size, Milliseconds timeout = std::chrono::seconds(60));

}  // namespace hpm::comm
