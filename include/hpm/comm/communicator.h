// Communicator: collectives and point-to-point messages among the ranks of a group, in the manner
// of PyTorch's c10d ProcessGroup. Every call is asynchronous and returns a Work to wait on; a
// collective must be issued in the same order on every rank. Backends: local (ranks are threads of
// one process sharing memory, local.h) and gloo (processes and hosts over TCP, gloo.h).
//
// Buffers are contiguous float32 tensors that stay alive and untouched until the Work completes.
// Anything that goes wrong (a peer that dies, never arrives or times out, mismatched sizes) makes
// the Work fail with a CommError that names the operation and the rank(s) at fault; nothing waits
// longer than the communicator's timeout.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "hpm/tensor/tensor.h"

namespace hpm::comm {

using Milliseconds = std::chrono::milliseconds;

class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { kSum, kAverage, kMax };

// All-reduce algorithms. kAuto picks by message size (kRecursiveDoubling below
// Communicator::small_message_bytes, else kRing for the gloo backend and kDirect for the local
// one, where every rank can read every other rank's buffer).
enum class Algorithm {
  kAuto,
  kDirect,             // all-to-all exchange ("distribution all-reduce"): each rank reduces 1/N
  kRing,               // reduce-scatter then all-gather around a ring, chunked and pipelined
  kRecursiveDoubling,  // log2(N) pairwise exchanges of the whole message: latency-optimal
};

const char* reduce_op_name(ReduceOp op);
const char* algorithm_name(Algorithm a);
// "auto", "direct", "ring", "recursive_doubling" (also "halving_doubling"); throws
// std::invalid_argument listing the choices.
Algorithm algorithm_from_name(const std::string& name);

// The result of an asynchronous call. wait() blocks until the operation is done; it throws the
// operation's CommError, or a CommError of its own when `timeout` passes first (the operation
// may still complete later; the communicator's own timeout fails it for good).
class Work {
 public:
  // `limit` bounds every wait (a recv whose message never comes fails after it).
  explicit Work(std::string what, Milliseconds limit = Milliseconds::max())
      : what_(std::move(what)), limit_(limit) {}
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  void wait(Milliseconds timeout);
  void wait() { wait(Milliseconds::max()); }
  // Waits at most `timeout`: true once the operation is done, false if it is still running then;
  // throws the operation's CommError if it failed. Unlike catching wait()'s timeout and then
  // asking completed(), this cannot mistake an operation that ends in between for a failed one.
  bool wait_for(Milliseconds timeout);
  bool completed() const;
  const std::string& what() const { return what_; }

  // Withdraws a recv that no message has matched yet, where the backend can: the Work fails at
  // once with a CommError, having let go of its buffer (which the caller may then free, with the
  // Device it lives on), and a later message of its tag goes to a later recv. The local group
  // can; gloo cannot (a message arriving for a withdrawn receive aborts gloo's transport thread),
  // nor can any collective: there, and on a completed Work, it does nothing.
  virtual void cancel() {}

  // For backends: mark done, successfully or with the given exception.
  void finish(std::exception_ptr error = nullptr);

 protected:
  std::string what_;
  Milliseconds limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool failed_ = false;
  std::string error_;
};

using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "gloo", "hierarchical"

  // In place: every rank's `data` becomes the reduction over all ranks. F32, or BF16 (half the
  // bytes on the wire: gradients compressed as PyTorch's bf16_compress_hook does); a BF16
  // reduction adds in f32 and rounds each partial sum to bf16 (to nearest even), so the result
  // depends on the order of the additions, which is the same on every rank.
  virtual WorkPtr allreduce(Tensor data, ReduceOp op = ReduceOp::kSum) = 0;
  // `input` holds size() equal blocks; rank r's `output` (one block) becomes the reduction of
  // block r over all ranks.
  virtual WorkPtr reduce_scatter(Tensor input, Tensor output, ReduceOp op = ReduceOp::kSum) = 0;
  // `output` (size() blocks of input's size) becomes every rank's input, in rank order.
  // allgather, broadcast, send and recv move bytes: any dtype (U8 for control messages).
  virtual WorkPtr allgather(Tensor input, Tensor output) = 0;
  // In place: every rank's `data` becomes root's.
  virtual WorkPtr broadcast(Tensor data, int root) = 0;
  virtual WorkPtr barrier() = 0;
  // Point to point, matched by (peer, tag); messages with the same (peer, tag) arrive in order.
  // recv's `data` must have the sent message's size in bytes.
  virtual WorkPtr send(Tensor data, int dst, int tag) = 0;
  virtual WorkPtr recv(Tensor data, int src, int tag) = 0;

  Milliseconds timeout() const { return timeout_; }
  void set_timeout(Milliseconds t) { timeout_ = t; }
  Algorithm algorithm() const { return algorithm_; }
  void set_algorithm(Algorithm a) { algorithm_ = a; }
  // kAuto uses the latency-optimal algorithm below this size.
  std::size_t small_message_bytes() const { return small_message_bytes_; }
  void set_small_message_bytes(std::size_t b) { small_message_bytes_ = b; }

 protected:
  Communicator() = default;
  // Checks a buffer argument: defined, float32; throws std::invalid_argument naming `what`.
  static void check_buffer(const Tensor& t, const char* what);
  // A buffer whose bytes move unchanged (allgather, broadcast, send, recv): any dtype, in memory
  // the host can hand to the transport.
  static void check_bytes(const Tensor& t, const char* what);
  // allgather's input and output: of one dtype.
  static void check_same_dtype(const Tensor& a, const Tensor& b, const char* what);
  // F32 or BF16.
  static void check_allreduce_buffer(const Tensor& t, const char* what);

  Milliseconds timeout_{std::chrono::seconds(60)};
  Algorithm algorithm_ = Algorithm::kAuto;
  std::size_t small_message_bytes_ = 64 * 1024;
};

using CommunicatorPtr = std::shared_ptr<Communicator>;

}  // namespace hpm::comm
