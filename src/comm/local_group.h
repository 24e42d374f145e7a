// LocalGroup: the state the threads of a local communicator group share, and the collective
// algorithms that run on it. Every rank calls the same collective with its own buffers; ranks
// synchronize through a group barrier and through per-rank progress counters (a rank publishes
// "I finished step s of this collective" and its successor waits for exactly that), so the ring
// pipelines sub-chunks instead of moving in lockstep.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "hpm/comm/communicator.h"

namespace hpm::comm {

using Clock = std::chrono::steady_clock;

// What a rank says it is doing; ranks that disagree get an error naming both calls.
struct CollectiveDesc {
  const char* kind = "";
  std::int64_t count = 0;
  int root = -1;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;
  DType dtype = DType::F32;  // what `count` counts
  bool operator==(const CollectiveDesc&) const = default;
  std::string str() const;
};

class LocalGroup {
 public:
  explicit LocalGroup(int size);
  // Recvs still waiting fail, their buffers let go of first.
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const { return size_; }

  // Each takes the calling rank, its buffers, and the deadline of the whole collective.
  void allreduce(int rank, float* data, std::int64_t n, ReduceOp op, Algorithm algorithm,
                 Clock::time_point deadline);
  void reduce_scatter(int rank, const float* in, float* out, std::int64_t block, ReduceOp op,
                      Clock::time_point deadline);
  // These two move bytes, of any dtype.
  void allgather(int rank, const Tensor& in, const Tensor& out, Clock::time_point deadline);
  void broadcast(int rank, const Tensor& data, int root, Clock::time_point deadline);
  void barrier(int rank, Clock::time_point deadline);

  // Point to point: a send is copied into the mailbox (or straight into a posted recv) and
  // completes at once; a recv completes when its message is there.
  void send(int src, int dst, int tag, const Tensor& data);
  void recv(int dst, int src, int tag, const Tensor& data, const WorkPtr& work);
  // Withdraws a recv still waiting for its message: its Work fails, its buffer let go of.
  void withdraw(const Work* work);

  // The rank's communicator is gone: whoever waits for it fails.
  void leave(int rank);

  // Sub-chunk size of the ring's pipeline, in floats.
  static constexpr std::int64_t kRingSubChunk = 32 * 1024;

 private:
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> progress{0};
    float* data = nullptr;
    const float* in = nullptr;
    void* bytes = nullptr;  // allgather's and broadcast's buffers
    const void* bytes_in = nullptr;
    std::vector<float> stages;  // recursive doubling's per-step values
    CollectiveDesc desc;
    std::uint64_t ops = 0;  // collectives started by this rank
  };

  // Every rank arrives, then all go on. Checks that all ranks called the same collective.
  void sync(int rank, const CollectiveDesc& desc, Clock::time_point deadline);
  // Waits until `peer`'s progress reaches `target`.
  void wait_progress(int rank, int peer, std::uint64_t target, Clock::time_point deadline,
                     const CollectiveDesc& desc);
  void publish(int rank, std::uint64_t value);
  [[noreturn]] void fail(const std::string& message);  // marks the group failed and throws
  void check_failed_locked() const;

  void allreduce_direct(int rank, float* data, std::int64_t n, ReduceOp op,
                        Clock::time_point deadline, const CollectiveDesc& d);
  void allreduce_ring(int rank, float* data, std::int64_t n, ReduceOp op,
                      Clock::time_point deadline, const CollectiveDesc& d);
  void allreduce_doubling(int rank, float* data, std::int64_t n, ReduceOp op,
                          Clock::time_point deadline, const CollectiveDesc& d);

  const int size_;
  std::vector<Slot> slots_;

  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::atomic<std::uint64_t> generation_{0};  // written under mu_, spun on without it
  std::vector<std::uint64_t> arrived_at_;     // generation each rank last arrived at
  std::vector<bool> left_;
  std::string failure_;
  std::atomic<int> waiters_{0};

  struct Message {
    int src, dst, tag;
    std::vector<char> data;
  };
  struct PendingRecv {
    int src, dst, tag;
    Tensor data;
    WorkPtr work;
  };
  std::mutex mail_mu_;
  std::vector<Message> mailbox_;
  std::vector<PendingRecv> pending_;
};

}  // namespace hpm::comm
