// The gloo backend: ranks are processes, on one host or many, connected by Gloo's TCP transport
// (a full mesh of sockets). Collectives run in issue order on one background thread per
// communicator; send/recv bypass that queue so a pipeline stage's message never waits behind an
// all-reduce.
//
// All-reduce algorithms (Communicator::set_algorithm):
//   kRing               gloo's ring: reduce-scatter then all-gather, segmented and pipelined
//   kRecursiveDoubling  gloo's bcube with groups of 2: recursive halving-doubling when the world
//                       size is a power of 2; otherwise halving-doubling over its factors of 2 and
//                       one direct exchange among the remaining odd factor
//   kDirect             ours, on gloo's unbound buffers: every rank sends block j to rank j, which
//                       reduces it and sends it back to all (2 steps, N-1 peers each)
//   kAuto               kRecursiveDoubling below small_message_bytes(), else kRing
// reduce_scatter is an all-reduce followed by a copy of the rank's own block (gloo has no
// reduce-scatter in its options API); average is a sum divided by the world size.
//
// Failures. The first operation that fails breaks the communicator for good: it records a note in
// the rendezvous store, closes every connection (so peers blocked on this rank fail at once rather
// than at their timeout), then names the rank at fault from what each connection saw and which
// peers left notes within a grace period (timeout/10, within 200 ms..2 s): a peer whose
// connection closed and that left no note is gone ("rank 2 (pid 812 on node1, 10.0.0.2) is gone:
// the connection closed without an error report (the process exited, died or was killed)"); a
// peer that neither closed nor reported is not responding (hung). Without notes (the TCP store
// went down with rank 0) a closed connection to rank 0 blames rank 0. Every later call fails at
// once, saying so. Rank 0 keeps its store up for the grace period after a failure.
// A rank that never arrives at rendezvous is named too ("rank(s) 2 did not arrive within 30 s").
// The backend ignores SIGPIPE for the process: a write to a dead peer must be an error, not a kill.
// send/recv: tags in 0..2^24-1; a recv whose size differs from the send's never matches it (and
// times out) rather than crashing gloo's event loop.
#pragma once
#include <optional>
#include <string>

#include "hpm/comm/communicator.h"

namespace hpm::comm {

struct GlooOptions {
  int rank = 0, world_size = 1;
  // "HOST:PORT": hpm's TCP store, hosted by rank 0 (port 0 only makes sense for world size 1);
  // anything else is a directory for gloo's FileStore, shared by all ranks.
  std::string rendezvous;
  std::string hostname = "127.0.0.1";              // the address this rank's gloo device binds to
  Milliseconds timeout{std::chrono::seconds(60)};  // rendezvous, then every operation
  // Key prefix in the store, so a restarted group can rendezvous again under a new one.
  std::string prefix = "hpm";
};

// Rendezvous with the other ranks and connect to all of them; throws CommError naming the ranks
// that did not arrive within the timeout, std::invalid_argument for bad options.
CommunicatorPtr make_gloo_communicator(const GlooOptions& options);

// Rank, world size and rendezvous from HPM_RANK / HPM_WORLD_SIZE / HPM_RENDEZVOUS (as set by
// `hpm launch`), or OpenMPI's OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE with HPM_RENDEZVOUS;
// HPM_HOSTNAME overrides the device address, HPM_TIMEOUT (seconds) the timeout. nullopt when rank
// or world size is unset; throws std::invalid_argument when a variable is malformed or
// HPM_RENDEZVOUS is missing.
std::optional<GlooOptions> gloo_options_from_env();

}  // namespace hpm::comm
