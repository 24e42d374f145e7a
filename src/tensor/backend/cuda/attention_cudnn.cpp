#include "tensor/backend/cuda/attention_cudnn.h"

#include <atomic>
#include <bit>
#include <cstdio>
#include <string>

#include "tensor/backend/cuda/runtime.h"

#if defined(HPM_HAVE_CUDNN_FRONTEND)
#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "hpm/tensor/tensor.h"
#include "tensor/backend/cuda/cudnn_handle.h"
#endif

namespace hpm::cuda {

bool cudnn_attention_requested() {
  static const bool on = opt_in_switch_on("HPM_CUDA_ATTENTION_CUDNN");
  return on;
}

#if !defined(HPM_HAVE_CUDNN_FRONTEND)

namespace {

bool say_not_built() {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    std::fprintf(stderr,
                 "hpm: cuDNN attention: HPM_CUDA_ATTENTION_CUDNN=1, but this build has no cuDNN "
                 "frontend (scripts/fetch_cudnn_frontend.sh, then build again): hpm's kernels run "
                 "the attention\n");
  }
  return false;
}

}  // namespace

bool cudnn_attention_forward(const CudnnAttention&, const void*, void*, float*) {
  return say_not_built();
}

bool cudnn_attention_backward(const CudnnAttention&, const void*, const void*, const void*,
                              const float*, void*) {
  return say_not_built();
}

#else

namespace fe = cudnn_frontend;

namespace {

// "the forward of 16 x 12 heads, t 1024, d 64, causal": how the stderr lines name a problem.
std::string describe(const CudnnAttention& a, bool backward) {
  char text[160];
  std::snprintf(text, sizeof text, "the %s of %lld x %lld heads, t %lld, d %lld%s",
                backward ? "backward" : "forward", static_cast<long long>(a.batch),
                static_cast<long long>(a.heads), static_cast<long long>(a.t),
                static_cast<long long>(a.d), a.causal ? ", causal" : "");
  return text;
}

using Uid = fe::graph::Tensor_attributes::uid_t;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using Dims = std::vector<std::int64_t>;

// The variant pack's tensor ids.
constexpr Uid kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8, kDV = 9;

// A problem's (batch, heads, t, d) extents and the strides of its two layouts: q, k and v (and
// their gradients) in the packed (batch, t, 3 x heads x d) rows, the output (and its gradient) in
// merged (batch, t, heads x d) rows; and lse's (batch, heads, t).
Dims extents(const CudnnAttention& a) { return {a.batch, a.heads, a.t, a.d}; }
Dims packed_strides(const CudnnAttention& a) {
  const std::int64_t e = a.heads * a.d;
  return {a.t * 3 * e, a.d, 3 * e, 1};
}
Dims merged_strides(const CudnnAttention& a) {
  const std::int64_t e = a.heads * a.d;
  return {a.t * e, a.d, e, 1};
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

TensorPtr operand(fe::graph::Graph& g, const char* name, Uid uid, const Dims& extents,
                  const Dims& strides) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(extents).set_stride(
          strides));
}

// lse as hpm lays it out: (batch, heads, t), F32.
void as_lse(fe::graph::Tensor_attributes& t, const CudnnAttention& a) {
  t.set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({a.batch, a.heads, a.t, 1})
      .set_stride({a.heads * a.t, a.t, 1, 1});
}

std::shared_ptr<fe::graph::Graph> forward_graph(const CudnnAttention& a) {
  auto g = new_graph();
  const Dims x = extents(a), packed = packed_strides(a);
  const TensorPtr q = operand(*g, "q", kQ, x, packed), k = operand(*g, "k", kK, x, packed),
                  v = operand(*g, "v", kV, x, packed);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("attention")
                     .set_generate_stats(true)
                     .set_attn_scale(a.scale)
                     .set_causal_mask(a.causal);
  auto [o, stats] = g->sdpa(q, k, v, options);
  o->set_output(true).set_uid(kO).set_dim(x).set_stride(merged_strides(a));
  stats->set_output(true);
  as_lse(*stats, a);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const CudnnAttention& a) {
  auto g = new_graph();
  const Dims x = extents(a), packed = packed_strides(a), merged = merged_strides(a);
  const TensorPtr q = operand(*g, "q", kQ, x, packed), k = operand(*g, "k", kK, x, packed),
                  v = operand(*g, "v", kV, x, packed), o = operand(*g, "o", kO, x, merged),
                  dout = operand(*g, "dout", kDO, x, merged);
  const TensorPtr lse = g->tensor(fe::graph::Tensor_attributes().set_name("lse"));
  as_lse(*lse, a);
  // Deterministic: dq's sums in a fixed order (cuDNN's default adds the key blocks' shares with
  // atomics, in whatever order they come), as hpm's kernels do (ordered_turns.cuh).
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(a.scale)
                     .set_causal_mask(a.causal)
                     .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, lse, options);
  dq->set_output(true).set_uid(kDQ).set_dim(x).set_stride(packed);
  dk->set_output(true).set_uid(kDK).set_dim(x).set_stride(packed);
  dv->set_output(true).set_uid(kDV).set_dim(x).set_stride(packed);
  return g;
}

// Builds a graph's execution plan on the handle: "" when done, else the step that failed and
// cuDNN's message.
std::string build(fe::graph::Graph& g, cudnnHandle_t handle) {
  const auto failed = [](const char* step, fe::error_t e) -> std::string {
    return e.is_good() ? std::string() : std::string(step) + ": " + e.get_message();
  };
  std::string why = failed("validate", g.validate());
  if (why.empty()) why = failed("build_operation_graph", g.build_operation_graph(handle));
  if (why.empty())
    why = failed("create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A}));
  if (why.empty()) why = failed("check_support", g.check_support(handle));
  if (why.empty()) why = failed("build_plans", g.build_plans(handle));
  return why;
}

// A problem's built graph (null where cuDNN has none) and its workspace.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
  std::mutex running;  // one execution at a time of a graph on its device's handle
};

// device, backward, batch, heads, t, d, causal, scale's bits
using Key = std::tuple<int, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool,
                       std::uint32_t>;

// The problem's plan, built (and said on stderr) at its first call.
Plan& plan_for(const CudnnAttention& a, bool backward) {
  static std::mutex mu;
  static auto* plans = new std::map<Key, std::unique_ptr<Plan> >();  // for the process
  const Key key{current_context().index,
                backward,
                a.batch,
                a.heads,
                a.t,
                a.d,
                a.causal,
                std::bit_cast<std::uint32_t>(a.scale)};
  std::lock_guard lock(mu);
  std::unique_ptr<Plan>& slot = (*plans)[key];
  if (slot) return *slot;
  slot = std::make_unique<Plan>();
  std::string why;
  try {
    std::shared_ptr<fe::graph::Graph> g = backward ? backward_graph(a) : forward_graph(a);
    why = build(*g, cudnn_handle());
    if (why.empty()) {
      fe::error_t e = g->get_workspace_size(slot->workspace);
      if (e.is_good()) {
        slot->graph = std::move(g);
      } else {
        why = "get_workspace_size: " + e.get_message();
      }
    }
  } catch (const std::exception& e) {
    why = std::string("the frontend threw: ") + e.what();
  }
  if (why.empty()) {
    std::fprintf(stderr, "hpm: cuDNN attention: %s on cuDNN's plan, workspace %lld bytes\n",
                 describe(a, backward).c_str(), static_cast<long long>(slot->workspace));
  } else {
    std::fprintf(stderr, "hpm: cuDNN attention: no plan for %s (%s): hpm's kernels run it\n",
                 describe(a, backward).c_str(), why.c_str());
  }
  return *slot;
}

bool run(const CudnnAttention& a, bool backward, std::unordered_map<Uid, void*>& pack) {
  Plan& p = plan_for(a, backward);
  if (!p.graph) return false;
  // From the caching allocator, freed in stream order after the graph's kernels.
  const Tensor workspace = p.workspace > 0 ? Tensor::empty({p.workspace}, DType::U8) : Tensor();
  std::lock_guard lock(p.running);
  fe::error_t e =
      p.graph->execute(cudnn_handle(), pack, workspace.defined() ? device_ptr(workspace) : nullptr);
  if (e.is_bad()) {
    throw std::runtime_error("cuDNN attention: " + describe(a, backward) +
                             " failed: " + e.get_message());
  }
  return true;
}

// q's, k's and v's first elements in a packed (batch, t, 3 x heads x d) BF16 tensor.
void* part(const void* packed, const CudnnAttention& a, int which) {
  const std::int64_t bytes = which * a.heads * a.d * 2;
  return const_cast<char*>(static_cast<const char*>(packed)) + bytes;
}

}  // namespace

bool cudnn_attention_forward(const CudnnAttention& a, const void* qkv, void* out, float* lse) {
  std::unordered_map<Uid, void*> pack{{kQ, part(qkv, a, 0)},
                                      {kK, part(qkv, a, 1)},
                                      {kV, part(qkv, a, 2)},
                                      {kO, out},
                                      {kStats, lse}};
  return run(a, false, pack);
}

bool cudnn_attention_backward(const CudnnAttention& a, const void* qkv, const void* out,
                              const void* dout, const float* lse, void* dqkv) {
  std::unordered_map<Uid, void*> pack{
      {kQ, part(qkv, a, 0)},          {kK, part(qkv, a, 1)},
      {kV, part(qkv, a, 2)},          {kO, const_cast<void*>(out)},
      {kDO, const_cast<void*>(dout)}, {kStats, const_cast<float*>(lse)},
      {kDQ, part(dqkv, a, 0)},        {kDK, part(dqkv, a, 1)},
      {kDV, part(dqkv, a, 2)}};
  return run(a, true, pack);
}

#endif

}  // namespace hpm::cuda
