#include "hpm/distribute/reducer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "hpm/tensor/kernels.h"
#include "hpm/trace/trace.h"

namespace hpm::distribute {

namespace {

// "name[d0,d1]" for every parameter, one per line: what ranks compare.
std::vector<std::string> describe_parameters(const nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& [name, t] : model.named_parameters()) out.push_back(name + t.shape().str());
  return out;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

}  // namespace

void verify_same_model(const nn::Module& model, comm::Communicator& comm) {
  // Bytes: first every rank's length, then the texts padded to the longest.
  std::string text = join_lines(describe_parameters(model));
  const int size = comm.size();
  Tensor lengths = Tensor::empty({size}, DType::I64);
  const std::vector<std::int64_t> mine{static_cast<std::int64_t>(text.size())};
  comm.allgather(Tensor::from_i64(mine, {1}), lengths)->wait();
  const std::vector<std::int64_t> length = lengths.to_vector_i64();
  const std::int64_t longest = *std::max_element(length.begin(), length.end());
  const std::string padded = text + std::string(static_cast<std::size_t>(longest) - text.size(), 0);
  Tensor all = Tensor::empty({longest * size}, DType::U8);
  comm.allgather(Tensor::from_bytes(padded), all)->wait();
  const std::string every = all.to_bytes();
  auto text_of = [&](int r) {
    return every.substr(static_cast<std::size_t>(r * longest),
                        static_cast<std::size_t>(length[static_cast<std::size_t>(r)]));
  };
  const std::string reference = text_of(0);
  for (int r = 1; r < size; ++r) {
    const std::string other = text_of(r);
    if (other == reference) continue;
    std::istringstream a(reference), b(other);
    std::string la, lb;
    int index = 0;
    while (true) {
      const bool ha = static_cast<bool>(std::getline(a, la)),
                 hb = static_cast<bool>(std::getline(b, lb));
      if (!ha && !hb) break;
      if (!ha) la = "(nothing)";
      if (!hb) lb = "(nothing)";
      if (la != lb) {
        throw std::runtime_error("rank " + std::to_string(r) +
                                 " holds a different model from rank 0: parameter " +
                                 std::to_string(index) + " is " + lb + " on rank " +
                                 std::to_string(r) + " but " + la + " on rank 0");
      }
      ++index;
    }
  }
}

namespace {
// The F32 tensors of `named` packed into one flat tensor, `collective` run on it, and the result
// copied back: one message for many small tensors. Nothing runs when there is none.
void through_one_flat_tensor(const nn::NamedTensors& named,
                             const std::function<void(Tensor&)>& collective) {
  std::int64_t total = 0;
  for (const auto& [name, t] : named)
    if (t.dtype() == DType::F32) total += t.numel();
  if (total == 0) return;
  Tensor flat = Tensor::empty({total});
  std::int64_t off = 0;
  for (const auto& [name, t] : named) {
    if (t.dtype() != DType::F32) continue;
    flat.narrow(off, t.numel()).copy_(t);
    off += t.numel();
  }
  collective(flat);
  off = 0;
  for (auto [name, t] : named) {
    if (t.dtype() != DType::F32) continue;
    t.copy_(flat.narrow(off, t.numel()));
    off += t.numel();
  }
}
}  // namespace

void broadcast_state(const nn::Module& model, comm::Communicator& comm) {
  through_one_flat_tensor(model.state_dict(),
                          [&](Tensor& flat) { comm.broadcast(flat, 0)->wait(); });
}

void average_buffers(const nn::Module& model, comm::Communicator& comm) {
  if (comm.size() == 1) return;  // the same decision on every rank
  through_one_flat_tensor(model.named_buffers(), [&](Tensor& flat) {
    comm.allreduce(flat)->wait();
    kernels::scale_(flat, 1.0f / static_cast<float>(comm.size()));
  });
}

// ---------------------------------------------------------------------------------------------

struct Reducer::State {
  struct Bucket {
    std::vector<std::size_t> params;  // indices into State::params
    Tensor flat;
    Tensor wire;  // the bf16 message, when the buckets travel compressed
    std::size_t pending = 0;
    bool launched = false;
    comm::WorkPtr work;
  };

  comm::CommunicatorPtr comm;
  ReducerOptions options;
  std::vector<Tensor> params;
  std::vector<std::size_t> bucket_of;   // per parameter
  std::vector<std::int64_t> offset_of;  // per parameter: elements into its bucket
  std::vector<Bucket> buckets;
  std::size_t next_launch = 0;
  bool sync = true;
  bool armed = false;
  ReducerStats stats;
  std::mutex mu;  // hooks may fire from any thread that runs backward

  // How many gradient accumulations each parameter receives in one backward. A parameter used
  // twice (a GPT's embedding tied to its head) receives two, in separate backwards when its uses
  // are recomputed in separate segments; launching its bucket at the first would all-reduce a
  // partial gradient while the second is still being added into the same memory (replicas then
  // diverge). The first synchronized backward launches nothing before finalize() and counts;
  // later ones launch a bucket once each of its parameters has received its count (as DDP's
  // static_graph learns the graph from its first iteration). A parameter the first backward did
  // not use (count 0) holds its bucket until finalize().
  std::vector<int> uses_expected, uses_seen;
  bool uses_learned = false;
  std::string extra_use;  // a parameter that received more than its count after its launch

  void mark_ready(std::size_t param) {
    std::lock_guard<std::mutex> lock(mu);
    if (!sync || !armed) return;
    const int seen = ++uses_seen[param];
    if (!uses_learned) return;
    Bucket& b = buckets[bucket_of[param]];
    if (seen > uses_expected[param] && b.launched && extra_use.empty()) {
      extra_use = "parameter " + std::to_string(param) + " received " + std::to_string(seen) +
                  " gradient accumulations, " + std::to_string(uses_expected[param]) +
                  " in the first step";
    }
    if (seen != uses_expected[param]) return;
    --b.pending;
    if (options.overlap) launch_ready_locked();
  }

  void launch_ready_locked() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0)
      launch(buckets[next_launch++]);
  }

  // The slot of bucket memory that parameter i's gradient lives in while the reducer runs
  // (PyTorch's gradient_as_bucket_view): backward writes there, the all-reduce averages in place,
  // and the optimizer reads the result, with no copy in or out.
  Tensor slot(std::size_t i) const {
    const Bucket& b = buckets[bucket_of[i]];
    return b.flat.narrow(offset_of[i], params[i].numel()).reshape(params[i].shape());
  }

  bool in_slot(std::size_t i) {
    const Tensor g = params[i].grad();
    const Tensor& flat = buckets[bucket_of[i]].flat;
    return g.defined() && g.same_storage(flat) &&
           g.impl()->offset == flat.impl()->offset + offset_of[i];
  }

  void launch(Bucket& b) {
    for (std::size_t i : b.params) {
      Tensor& p = params[i];
      AutogradMeta& meta = p.autograd_meta();
      if (!in_slot(i)) {
        // A gradient from elsewhere (accumulated before the reducer took over): into the slot.
        Tensor s = slot(i);
        if (p.grad().defined()) {
          s.copy_(p.grad());
        } else {
          s.fill_(0.0f);
        }
        p.set_grad(s);
        meta.grad_is_stale = false;
      } else if (meta.grad_is_stale) {
        // No gradient arrived (a parameter this step did not use): it contributes zeros.
        p.grad().fill_(0.0f);
        meta.grad_is_stale = false;
      }
    }
    b.launched = true;
    ++stats.allreduces;
    if (options.allreduce_dtype == DType::BF16) {
      b.wire.copy_(kernels::to_bf16(b.flat));
      b.work = comm->allreduce(b.wire, comm::ReduceOp::kSum);
    } else {
      b.work = comm->allreduce(b.flat, comm::ReduceOp::kAverage);
    }
  }

  // A compressed bucket's sum back into its f32 slots, divided by the replicas.
  void decompress(Bucket& b) const {
    Tensor sum = kernels::to_f32(b.wire);
    kernels::scale_(sum, 1.0f / static_cast<float>(comm->size()));
    b.flat.copy_(sum);
  }
};

Reducer::Reducer(const nn::Module& model, comm::CommunicatorPtr comm, ReducerOptions options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.comm = std::move(comm);
  s.options = options;
  if (options.allreduce_dtype != DType::F32 && options.allreduce_dtype != DType::BF16) {
    throw std::invalid_argument(
        std::string("Reducer: gradients are all-reduced in f32 or bf16, not ") +
        dtype_name(options.allreduce_dtype));
  }
  verify_same_model(model, *s.comm);
  broadcast_state(model, *s.comm);
  for (const auto& [name, t] : model.named_parameters()) s.params.push_back(t);
  s.bucket_of.resize(s.params.size());
  std::size_t bytes = 0;
  for (std::size_t k = s.params.size(); k-- > 0;) {
    const std::size_t nbytes = s.params[k].nbytes();
    if (s.buckets.empty() || (bytes + nbytes > options.bucket_bytes && bytes > 0)) {
      s.buckets.emplace_back();
      bytes = 0;
    }
    s.buckets.back().params.push_back(k);
    s.bucket_of[k] = s.buckets.size() - 1;
    bytes += nbytes;
  }
  s.offset_of.resize(s.params.size());
  for (auto& b : s.buckets) {
    std::int64_t n = 0;
    for (std::size_t i : b.params) {
      s.offset_of[i] = n;
      n += s.params[i].numel();
    }
    b.flat = Tensor::empty({n});
    if (options.allreduce_dtype == DType::BF16) b.wire = Tensor::empty({n}, DType::BF16);
    s.stats.bytes += static_cast<std::size_t>(n) * dtype_size(options.allreduce_dtype);
  }
  s.stats.buckets = s.buckets.size();
  s.uses_seen.assign(s.params.size(), 0);
  std::weak_ptr<State> weak = state_;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    s.params[i].autograd_meta().post_accumulate_hooks.push_back([weak, i](Tensor&) {
      if (auto st = weak.lock()) st->mark_ready(i);
    });
  }
}

Reducer::~Reducer() {
  // Nothing may still write into buckets that are about to be freed.
  for (auto& b : state_->buckets) {
    if (b.work) {
      try {
        b.work->wait();
      } catch (const std::exception&) {
      }
    }
  }
}

void Reducer::prepare_for_backward() {
  std::lock_guard<std::mutex> lock(state_->mu);
  State& s = *state_;
  for (auto& b : s.buckets) {
    b.pending = b.params.size();
    b.launched = false;
    b.work.reset();
  }
  std::fill(s.uses_seen.begin(), s.uses_seen.end(), 0);
  s.extra_use.clear();
  // Gradients start in their slots: the first accumulation copies in (the slot's old contents are
  // stale), later ones add. A gradient already accumulated (micro-batches under NoSync) stays
  // where it is until its bucket launches.
  if (s.sync) {
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      Tensor& p = s.params[i];
      if (p.grad().defined()) continue;
      p.set_grad(s.slot(i));
      p.autograd_meta().grad_is_stale = true;
    }
  }
  s.next_launch = 0;
  s.armed = true;
}

void Reducer::finalize() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.sync) return;
    if (!s.armed) throw std::logic_error("Reducer::finalize without prepare_for_backward");
    if (!s.uses_learned) {
      s.uses_expected = s.uses_seen;
      s.uses_learned = true;
    }
    for (auto& b : s.buckets) b.pending = 0;  // unused parameters contribute zeros
    s.launch_ready_locked();
    s.armed = false;
  }
  const auto t0 = std::chrono::steady_clock::now();
  {
    trace::Span span("wait for all-reduce", "comm");
    for (auto& b : s.buckets) {
      b.work->wait();
      if (s.options.allreduce_dtype == DType::BF16) s.decompress(b);
    }
  }
  s.stats.finalize_wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.extra_use.empty()) {
    throw std::logic_error(
        "Reducer: " + s.extra_use +
        ", after its bucket was all-reduced: the model's graph changed between steps, and this "
        "step's gradients are not the replicas' average (turn the reducer's overlap off)");
  }
}

void Reducer::set_sync(bool on) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->sync = on;
}

bool Reducer::sync_enabled() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->sync;
}

const ReducerStats& Reducer::stats() const { return state_->stats; }
const comm::CommunicatorPtr& Reducer::communicator() const { return state_->comm; }

}  // namespace hpm::distribute
