// The local backend: N ranks as threads of one process, sharing memory. Collectives read peers'
// buffers directly (no copies through a transport), which is what makes an in-process all-reduce
// several times faster than a message-passing one on the same cores.
//
// Each communicator runs its collectives on a thread of its own, so a rank's thread can keep
// computing while its all-reduce proceeds. A rank whose communicator is destroyed leaves the
// group: the others' pending and later collectives fail with a CommError naming it. A rank that
// does not reach a collective within the timeout fails the collective on every rank, and the
// group stays failed (as NCCL's communicators do after an error), naming the rank(s) missing.
#pragma once
#include <functional>
#include <vector>

#include "hpm/comm/communicator.h"

namespace hpm::comm {

// One communicator per rank, rank i at index i.
std::vector<CommunicatorPtr> make_local_group(int size,
                                              Milliseconds timeout = std::chrono::seconds(60));

// Runs `rank_main` on `size` threads, each with its rank's communicator of a new local group
// (owned by its thread: a rank that fails leaves the group at once, and its peers' collectives
// fail naming it), and waits for all. Then rethrows a rank's own failure first (its peers'
// CommErrors only say that it left), else the first CommError.
void run_local_group(int size, const std::function<void(CommunicatorPtr)>& rank_main,
                     Milliseconds timeout = std::chrono::seconds(60));

}  // namespace hpm::comm
