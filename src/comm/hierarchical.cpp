#include "hpm/comm/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "comm/work_queue.h"
#include "hpm/comm/local.h"
#include "hpm/tensor/backend/cpu.h"  // host views: bf16 messages as bytes
#include "hpm/tensor/kernels.h"

namespace hpm::comm {

namespace {

class HierarchicalCommunicator final : public Communicator {
 public:
  HierarchicalCommunicator(CommunicatorPtr local, CommunicatorPtr processes, int local_size,
                           Milliseconds timeout)
      : local_(std::move(local)),
        processes_(std::move(processes)),
        local_size_(local_size),
        num_processes_(processes_->size()),
        process_rank_(processes_->rank()),
        queue_(std::make_unique<WorkQueue>("comm rank " + std::to_string(rank()))) {
    timeout_ = timeout;
  }
  ~HierarchicalCommunicator() override { queue_.reset(); }

  int rank() const override { return process_rank_ * local_size_ + local_->rank(); }
  int size() const override { return num_processes_ * local_size_; }
  std::string backend() const override {
    return "hierarchical(local+" + processes_->backend() + ")";
  }

  WorkPtr allreduce(Tensor data, ReduceOp op) override {
    check_allreduce_buffer(data, "allreduce");
    return submit("allreduce", [this, data, op] {
      const ReduceOp step = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
      local_->allreduce(data, step)->wait();
      if (leader()) processes_->allreduce(data, step)->wait();
      if (data.dtype() == DType::BF16) {
        // Broadcast is f32: the bf16 values travel as f32 between threads (exact), and averaging
        // rounds once.
        Tensor f = kernels::to_f32(data);
        local_->broadcast(f, 0)->wait();
        if (op == ReduceOp::kAverage) {
          float* p = f.data<float>();
          const float s = 1.0f / static_cast<float>(size());
          for (std::int64_t i = 0; i < f.numel(); ++i) p[i] *= s;
        }
        cpu::f32_to_bf16(f.data<float>(), data.data<std::uint16_t>(), f.numel());
        return;
      }
      local_->broadcast(data, 0)->wait();
      if (op == ReduceOp::kAverage) {
        const float s = 1.0f / static_cast<float>(size());
        float* p = data.data<float>();
        for (std::int64_t i = 0; i < data.numel(); ++i) p[i] *= s;
      }
    });
  }

  WorkPtr reduce_scatter(Tensor input, Tensor output, ReduceOp op) override {
    check_buffer(input, "reduce_scatter input");
    check_buffer(output, "reduce_scatter output");
    if (input.numel() != output.numel() * size())
      throw std::invalid_argument("reduce_scatter: input is not size() blocks of output");
    // Through a full all-reduce: the two-level group has no cheaper way to scatter.
    Tensor whole = input.clone();
    WorkPtr reduced = allreduce(whole, op);
    return submit("reduce_scatter", [this, reduced, whole, output]() mutable {
      reduced->wait();
      output.copy_(block_of(whole, output.numel(), rank()));
    });
  }

  WorkPtr allgather(Tensor input, Tensor output) override {
    check_bytes(input, "allgather input");
    check_bytes(output, "allgather output");
    check_same_dtype(input, output, "allgather");
    if (output.numel() != input.numel() * size())
      throw std::invalid_argument("allgather: output is not size() blocks of input");
    return submit("allgather", [this, input, output] {
      Tensor mine = Tensor::empty({input.numel() * local_size_}, input.dtype());
      local_->allgather(input.reshape({-1}), mine)->wait();
      if (leader()) processes_->allgather(mine, output.reshape({-1}))->wait();
      local_->broadcast(output.reshape({-1}), 0)->wait();
    });
  }

  WorkPtr broadcast(Tensor data, int root) override {
    check_bytes(data, "broadcast");
    if (root < 0 || root >= size())
      throw std::invalid_argument("broadcast root " + std::to_string(root) + " is not a rank");
    return submit("broadcast", [this, data, root] {
      local_->broadcast(data, root % local_size_)->wait();  // the root's process: onto local rank 0
      if (leader()) processes_->broadcast(data, root / local_size_)->wait();
      local_->broadcast(data, 0)->wait();
    });
  }

  WorkPtr barrier() override {
    return submit("barrier", [this] {
      local_->barrier()->wait();
      if (leader()) processes_->barrier()->wait();
      local_->barrier()->wait();
    });
  }

  WorkPtr send(Tensor, int, int) override {
    throw std::logic_error(
        "send/recv across a hierarchical group are not supported; use the process-level "
        "communicator");
  }
  WorkPtr recv(Tensor, int, int) override {
    throw std::logic_error(
        "send/recv across a hierarchical group are not supported; use the process-level "
        "communicator");
  }

 private:
  bool leader() const { return local_->rank() == 0; }
  static Tensor block_of(const Tensor& whole, std::int64_t block, int r) {
    return whole.reshape({-1}).narrow(static_cast<std::int64_t>(r) * block, block);
  }
  WorkPtr submit(const char* kind, std::function<void()> job) {
    return queue_->submit("rank " + std::to_string(rank()) + ": " + kind, std::move(job));
  }

  CommunicatorPtr local_, processes_;
  int local_size_, num_processes_, process_rank_;
  std::unique_ptr<WorkQueue> queue_;
};

}  // namespace

std::vector<CommunicatorPtr> make_hierarchical_group(CommunicatorPtr processes, int local_size,
                                                     Milliseconds timeout) {
  if (local_size < 1)
    throw std::invalid_argument("a hierarchical group needs at least one local rank");
  auto local = make_local_group(local_size, timeout);
  std::vector<CommunicatorPtr> out;
  for (int r = 0; r < local_size; ++r) {
    out.push_back(
        std::make_shared<HierarchicalCommunicator>(local[r], processes, local_size, timeout));
  }
  return out;
}

}  // namespace hpm::comm
