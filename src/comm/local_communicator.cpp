// The local backend's Communicator: checks arguments on the caller's thread, then queues the
// collective for this rank's communication thread, which runs it on the shared LocalGroup.
#include <memory>
#include <string>
#include <thread>

#include "comm/local_group.h"
#include "comm/values_text.h"
#include "comm/work_queue.h"
#include "hpm/comm/local.h"
#include "hpm/tensor/backend/cpu.h"  // host views: bf16 messages as bytes
#include "hpm/tensor/kernels.h"
#include "hpm/trace/trace.h"

namespace hpm::comm {

namespace {

// A recv that can be withdrawn from its group while no message has matched it.
class RecvWork final : public Work {
 public:
  RecvWork(std::string what, Milliseconds limit, std::weak_ptr<LocalGroup> group)
      : Work(std::move(what), limit), group_(std::move(group)) {}
  // A group already gone has failed its pending recvs (~LocalGroup); one going on another thread
  // now may not have yet, and this Work then stays in flight.
  void cancel() override {
    if (auto group = group_.lock()) group->withdraw(this);
  }

 private:
  std::weak_ptr<LocalGroup> group_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank, Milliseconds timeout)
      : group_(std::move(group)),
        rank_(rank),
        queue_(std::make_unique<WorkQueue>("comm rank " + std::to_string(rank))) {
    timeout_ = timeout;
  }
  ~LocalCommunicator() override {
    queue_.reset();  // finishes what was queued
    group_->leave(rank_);
  }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string backend() const override { return "local"; }

  WorkPtr allreduce(Tensor data, ReduceOp op) override {
    check_allreduce_buffer(data, "allreduce");
    Algorithm a = algorithm_;
    if (a == Algorithm::kAuto) {
      a = data.nbytes() < small_message_bytes_ ? Algorithm::kRecursiveDoubling : Algorithm::kDirect;
    }
    return submit("allreduce", data.numel(), [this, data, op, a](Clock::time_point deadline) {
      trace::Span span("allreduce", "comm");
      if (data.dtype() == DType::F32) {
        group_->allreduce(rank_, data.data<float>(), data.numel(), op, a, deadline);
        return;
      }
      // Threads share memory: bf16 would save no bytes. Reduce the bf16 values in f32 and round
      // the result once.
      std::vector<float> f(static_cast<std::size_t>(data.numel()));
      cpu::bf16_to_f32(data.data<std::uint16_t>(), f.data(), data.numel());
      group_->allreduce(rank_, f.data(), data.numel(), op, a, deadline);
      cpu::f32_to_bf16(f.data(), data.data<std::uint16_t>(), data.numel());
    });
  }

  WorkPtr reduce_scatter(Tensor input, Tensor output, ReduceOp op) override {
    check_buffer(input, "reduce_scatter input");
    check_buffer(output, "reduce_scatter output");
    check_blocks(input, output, "reduce_scatter");
    return submit("reduce_scatter", input.numel(),
                  [this, input, output, op](Clock::time_point deadline) {
                    trace::Span span("reduce_scatter", "comm");
                    group_->reduce_scatter(rank_, input.data<float>(), output.data<float>(),
                                           output.numel(), op, deadline);
                  });
  }

  WorkPtr allgather(Tensor input, Tensor output) override {
    check_bytes(input, "allgather input");
    check_bytes(output, "allgather output");
    check_same_dtype(input, output, "allgather");
    check_blocks(output, input, "allgather");
    return submit("allgather", output.numel(), [this, input, output](Clock::time_point deadline) {
      trace::Span span("allgather", "comm");
      group_->allgather(rank_, input, output, deadline);
    });
  }

  WorkPtr broadcast(Tensor data, int root) override {
    check_bytes(data, "broadcast");
    check_rank(root, "broadcast root");
    return submit("broadcast", data.numel(), [this, data, root](Clock::time_point deadline) {
      trace::Span span("broadcast", "comm");
      group_->broadcast(rank_, data, root, deadline);
    });
  }

  WorkPtr barrier() override {
    return submit("barrier", 0,
                  [this](Clock::time_point deadline) { group_->barrier(rank_, deadline); });
  }

  WorkPtr send(Tensor data, int dst, int tag) override {
    check_bytes(data, "send");
    check_rank(dst, "send destination");
    auto work = std::make_shared<Work>("rank " + std::to_string(rank_) + ": send of " +
                                       std::to_string(data.numel()) + " " +
                                       values_of(data.dtype()) + " to rank " + std::to_string(dst));
    group_->send(rank_, dst, tag, data);
    work->finish();
    return work;
  }

  WorkPtr recv(Tensor data, int src, int tag) override {
    check_bytes(data, "recv");
    check_rank(src, "recv source");
    auto work = std::make_shared<RecvWork>("rank " + std::to_string(rank_) + ": recv of " +
                                               std::to_string(data.numel()) + " " +
                                               values_of(data.dtype()) + " from rank " +
                                               std::to_string(src) + " tag " + std::to_string(tag),
                                           timeout_, group_);
    group_->recv(rank_, src, tag, data, work);
    return work;
  }

 private:
  std::string describe(const char* kind, std::int64_t n) const {
    return "rank " + std::to_string(rank_) + ": " + kind + " of " + std::to_string(n) + " floats";
  }
  WorkPtr submit(const char* kind, std::int64_t n, std::function<void(Clock::time_point)> job) {
    const Milliseconds timeout = timeout_;
    return queue_->submit(describe(kind, n),
                          [job = std::move(job), timeout] { job(Clock::now() + timeout); });
  }
  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size()) {
      throw std::invalid_argument(std::string(what) + " " + std::to_string(r) +
                                  " is not a rank of a group of " + std::to_string(size()));
    }
  }
  // `whole` must hold size() blocks of `block`'s size.
  void check_blocks(const Tensor& whole, const Tensor& block, const char* what) const {
    if (whole.numel() != block.numel() * size()) {
      throw std::invalid_argument(std::string(what) + ": " + std::to_string(whole.numel()) +
                                  " floats are not " + std::to_string(size()) + " blocks of " +
                                  std::to_string(block.numel()));
    }
  }

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  std::unique_ptr<WorkQueue> queue_;
};

}  // namespace

std::vector<CommunicatorPtr> make_local_group(int size, Milliseconds timeout) {
  if (size < 1) throw std::invalid_argument("a local group needs at least one rank");
  auto group = std::make_shared<LocalGroup>(size);
  std::vector<CommunicatorPtr> comms;
  for (int r = 0; r < size; ++r)
    comms.push_back(std::make_shared<LocalCommunicator>(group, r, timeout));
  return comms;
}

void run_local_group(int size, const std::function<void(CommunicatorPtr)>& rank_main,
                     Milliseconds timeout) {
  std::vector<CommunicatorPtr> group = make_local_group(size, timeout);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r, c = std::move(group[static_cast<std::size_t>(r)])]() mutable {
      try {
        rank_main(std::move(c));
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommError&) {
    }  // anything else is the rank's own failure: it propagates from here
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace hpm::comm
