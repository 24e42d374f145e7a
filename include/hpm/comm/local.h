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
#include <vector>

#include "hpm/comm/communicator.h"

namespace hpm::comm {

// One communicator per rank, rank i at index i.
std::vector<CommunicatorPtr> make_local_group(int size,
                                              Milliseconds timeout = std::chrono::seconds(60));

}  // namespace hpm::comm
