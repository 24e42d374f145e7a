// Reducer: keeps data-parallel replicas' gradients in sync, as PyTorch's DDP reducer does.
// Parameters are grouped, in reverse registration order (roughly the order backward produces
// their gradients), into flat buckets of at most `bucket_bytes`. Each parameter's .grad is a view
// of its slot in a bucket (DDP's gradient_as_bucket_view: no copies in or out, and no second
// copy of the gradients in memory). A hook on each parameter marks its gradient ready; when every
// gradient of a bucket is ready the bucket's all-reduce (average) starts at once, in place, so
// communication overlaps the rest of backward: between backward and finalize() the gradients are
// being averaged and must not be read. Buckets start in index order on every rank, so all ranks
// issue the same collectives in the same order. finalize() waits for them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "hpm/comm/communicator.h"
#include "hpm/nn/module.h"

namespace hpm::distribute {

struct ReducerOptions {
  std::size_t bucket_bytes = 25u << 20;  // PyTorch's default bucket_cap_mb
  // false: every bucket's all-reduce waits for finalize(), i.e. runs after backward (for
  // measuring what overlap buys).
  bool overlap = true;
  // What the buckets travel as: F32, or BF16 (half the bytes; each bucket is rounded to bf16 when
  // its all-reduce starts, summed in bf16 messages, and turned back into the f32 average when
  // finalize() waits for it, as PyTorch's bf16_compress_hook does).
  DType allreduce_dtype = DType::F32;
};

struct ReducerStats {
  std::size_t buckets = 0;
  std::size_t bytes = 0;             // gradient bytes all-reduced per step (on the wire)
  double finalize_wait_seconds = 0;  // time finalize() waited for all-reduces, summed over steps
  std::uint64_t allreduces = 0;      // bucket all-reduces started, over all steps
};

class Reducer {
 public:
  // Checks that every rank holds the same parameters (names and shapes; a clear error naming the
  // first difference otherwise) and copies rank 0's parameter and buffer values to every rank.
  Reducer(const nn::Module& model, comm::CommunicatorPtr comm, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call before each backward that should synchronize: gradients not yet accumulated start in
  // their bucket slots.
  void prepare_for_backward();
  // Starts what is not started yet (parameters that got no gradient count as zero) and waits for
  // every bucket: each parameter's .grad then holds the average, in its bucket slot.
  void finalize();

  // While off, backward accumulates gradients locally and nothing is communicated (DDP's
  // no_sync, for gradient accumulation): the next synchronized backward reduces the sum.
  void set_sync(bool on);
  bool sync_enabled() const;

  const ReducerStats& stats() const;
  const comm::CommunicatorPtr& communicator() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// Disables synchronization for its lifetime: `{ NoSync guard(reducer); ...backward...; }`.
class NoSync {
 public:
  explicit NoSync(Reducer& r) : r_(r), was_(r.sync_enabled()) { r_.set_sync(false); }
  ~NoSync() { r_.set_sync(was_); }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  Reducer& r_;
  bool was_;
};

// Every rank must hold the same parameters, in the same order: throws std::runtime_error naming
// the first rank and parameter that differ from rank 0.
void verify_same_model(const nn::Module& model, comm::Communicator& comm);
// Copies rank 0's parameters and buffers to every rank.
void broadcast_state(const nn::Module& model, comm::Communicator& comm);

// Every rank's float buffers (BatchNorm's running statistics) become their mean over the ranks,
// as tf.distribute reads an ON_READ, MEAN-aggregated variable. Each replica's forwards update its
// own from its own rows, so without this every worker evaluated and saved other statistics (and
// EarlyStopping could stop one worker and not another). Collective.
void average_buffers(const nn::Module& model, comm::Communicator& comm);

}  // namespace hpm::distribute
