// 2-D convolution on oneDNN's convolution primitives (forward, backward data, backward weights).
//
// Why: oneDNN's direct JIT convolutions work on channel-blocked layouts (nChw16c, OIhw16i16o on
// AVX-512) and keep the kernel window in registers, so they skip the im2col buffer that the
// GEMM path writes and reads again (9x the input for a 3x3 kernel). Our tensors stay NCHW/OIHW:
// each primitive is created with format_tag::any so oneDNN picks its preferred layout, and we
// reorder at the boundary (cheap next to the convolution; skipped when oneDNN takes the plain
// layout as is, e.g. a 1-channel input). The fused Conv2d + ReLU + MaxPool2d op skips the two
// reorders of the convolution's output and its gradient: it pools from the blocked output and
// unpools into the blocked gradient (pool_blocked.h).
//
// Creating a primitive descriptor and JIT-compiling its kernel costs far more than one small
// convolution, so each plan (primitives plus reorders) is created once per shape and cached. The
// cache key includes the OpenMP thread count because oneDNN (OpenMP runtime) fixes the number of
// threads a primitive splits its work into when the primitive is created.
//
// Temporaries (blocked copies of operands and oneDNN's scratchpad) come from the tensor's Device
// in a single allocation per call: the caching allocator makes that cheap, the memory is counted
// against the device's budget like any other, and since the scratchpad is ours (scratchpad_mode::
// user) concurrent calls from several threads (one per device in data-parallel training) never
// share a buffer.
#include <omp.h>

#include <algorithm>
#include <compare>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <unordered_map>

#include "dnnl_context.h"
#include "hpm/tensor/backend/cpu.h"
#include "pool_blocked.h"

namespace hpm::cpu {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr memory::data_type kF32 = memory::data_type::f32;

// Everything a plan depends on. `part` distinguishes the forward plan from backward plans that
// compute different subsets of the gradients.
struct Key {
  std::int64_t n, c, h, w, oc, kh, kw;
  int stride_h, stride_w, pad_h, pad_w;
  int part;  // 0 forward, 16 forward + ReLU; else 1 | 2 (grad_x) | 4 (grad_w) | 8 (grad_bias with
             // grad_w)
  bool bias;
  bool bf16;  // operands in bf16 (Conv2dParams::bf16)
  int threads;
  auto operator<=>(const Key&) const = default;
};

Key make_key(const Tensor& x, const Tensor& w, const Conv2dParams& p, int part, bool bias) {
  const Shape &xs = x.shape(), &ws = w.shape();
  if (xs.rank() != 4 || ws.rank() != 4 || xs[1] != ws[1]) {
    throw std::invalid_argument("conv2d: input " + xs.str() + " (N,C,H,W) does not match weight " +
                                ws.str() + " (OC,C,KH,KW)");
  }
  if ((xs[2] + 2 * p.pad_h - ws[2]) < 0 || (xs[3] + 2 * p.pad_w - ws[3]) < 0) {
    throw std::invalid_argument("conv2d: kernel " + ws.str() + " larger than padded input " +
                                xs.str());
  }
  return Key{xs[0],   xs[1], xs[2],      xs[3],      ws[0],
             ws[2],   ws[3], p.stride_h, p.stride_w, p.pad_h,
             p.pad_w, part,  bias,       p.bf16,     omp_get_max_threads()};
}

std::int64_t out_h(const Key& k) { return (k.h + 2 * k.pad_h - k.kh) / k.stride_h + 1; }
std::int64_t out_w(const Key& k) { return (k.w + 2 * k.pad_w - k.kw) / k.stride_w + 1; }

// The shapes and convolution parameters of a key as oneDNN descriptors.
struct Descs {
  memory::dims src, wei, dst, bias, strides, pad_l, pad_r;
};
Descs descs(const Key& k) {
  Descs d;
  d.src = {k.n, k.c, k.h, k.w};
  d.wei = {k.oc, k.c, k.kh, k.kw};
  d.dst = {k.n, k.oc, out_h(k), out_w(k)};
  d.bias = {k.oc};
  d.strides = {k.stride_h, k.stride_w};
  d.pad_l = {k.pad_h, k.pad_w};
  // Right padding equal to the left: oneDNN checks (H - KH + pl + pr) / stride + 1 == OH with the
  // same floor division PyTorch uses, so unused trailing input rows/columns are allowed.
  d.pad_r = {k.pad_h, k.pad_w};
  return d;
}

// An operand in whatever layout the primitive prefers: f32, or for a bf16 plan's inputs (src,
// weights, diff_dst) and forward output bf16; the user's f32 tensors reach it through a reorder,
// which converts the type in the same pass. The forward output in bf16, as PyTorch's autocast
// gives it: it halves the bytes written and read back (by the reorder to the user's tensor, or by
// the fused op's pooling, which waited on them), and what reads it next is nearly always another
// bf16 convolution or GEMM, which rounds its input to bf16 anyway.
memory::desc any(const memory::dims& dims, memory::data_type type = kF32) {
  return memory::desc(dims, type, Tag::any);
}
memory::data_type operand_type(const Key& k) { return k.bf16 ? memory::data_type::bf16 : kF32; }

// Direct, not auto: oneDNN 2.6's auto picks Winograd (jit_wino_4x3) here, which measured slower
// in total (single thread: conv2 forward 2.1 vs 2.4 ms but backward 5.7 vs 4.8 ms, and the
// 1-channel conv1 forward 2.0 vs 0.4 ms) and rounds differently from PyTorch's direct convolution.
constexpr dnnl::algorithm kAlgorithm = dnnl::algorithm::convolution_direct;

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// One tensor argument in its plain layout (`user`: NCHW, OIHW) and in the layout the primitive
// wants (`prim`). When they differ, `reorder` converts user -> prim for inputs and prim -> user
// for outputs, through a temporary at byte `offset` of the call's workspace.
struct Operand {
  memory::desc user, prim;
  dnnl::reorder reorder;
  std::size_t offset = 0;
  bool converted() const { return user != prim; }
};

// Lays out the temporaries of one call in a single workspace, 64-byte aligned.
class WorkspaceLayout {
 public:
  std::size_t add(std::size_t bytes) {
    const std::size_t at = bytes_;
    bytes_ += (bytes + 63) & ~std::size_t{63};
    return at;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

// `shared`: an operand already converted by another primitive of the same call into the same
// layout; its copy is reused, so this one needs no reorder and no temporary.
Operand make_operand(const memory::dims& dims, Tag plain, const memory::desc& prim, bool input,
                     WorkspaceLayout& ws, const Operand* shared = nullptr) {
  Operand o{memory::desc(dims, kF32, plain), prim, {}, 0};
  if (shared && shared->prim == prim) {
    o.offset = shared->offset;
  } else if (o.converted()) {
    const memory::desc& from = input ? o.user : o.prim;
    const memory::desc& to = input ? o.prim : o.user;
    o.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), from, cpu_engine(), to));
    o.offset = ws.add(prim.get_size());
  }
  return o;
}

// oneDNN's scratchpad for one primitive, at byte `offset` of the call's workspace.
struct Scratch {
  memory::desc desc;
  std::size_t offset = 0;
};
Scratch make_scratch(const dnnl::primitive_desc_base& pd, WorkspaceLayout& ws) {
  Scratch sc{pd.scratchpad_desc(), 0};
  sc.offset = ws.add(sc.desc.get_size());
  return sc;
}

struct ForwardPlan {
  dnnl::convolution_forward conv;
  Operand src, wei, dst;
  memory::desc bias;  // zero when there is no bias
  Scratch scratch;
  std::size_t workspace_bytes = 0;
};

struct BackwardPlan {
  // grad_x
  dnnl::convolution_backward_data data;
  Operand data_dst, data_wei, data_src;
  Scratch data_scratch;
  // grad_w (and grad_bias)
  dnnl::convolution_backward_weights weights;
  Operand weights_src, weights_dst, weights_wei;
  memory::desc bias;
  Scratch weights_scratch;
  std::size_t workspace_bytes = 0;
};

dnnl::convolution_forward::primitive_desc forward_pd(const Key& k, bool bias) {
  const Descs d = descs(k);
  const dnnl::convolution_forward::desc desc(
      dnnl::prop_kind::forward_training, kAlgorithm, any(d.src, operand_type(k)),
      any(d.wei, operand_type(k)), bias ? memory::desc(d.bias, kF32, Tag::x) : memory::desc(),
      any(d.dst, operand_type(k)), d.strides, d.pad_l, d.pad_r);
  dnnl::primitive_attr attr = user_scratchpad();
  if (k.part == 16) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  return dnnl::convolution_forward::primitive_desc(desc, attr, cpu_engine());
}

std::shared_ptr<const ForwardPlan> create_forward(const Key& k) {
  const Descs d = descs(k);
  const auto pd = forward_pd(k, k.bias);
  auto plan = std::make_shared<ForwardPlan>();
  WorkspaceLayout ws;
  plan->conv = dnnl::convolution_forward(pd);
  plan->src = make_operand(d.src, Tag::nchw, pd.src_desc(), true, ws);
  plan->wei = make_operand(d.wei, Tag::oihw, pd.weights_desc(), true, ws);
  plan->dst = make_operand(d.dst, Tag::nchw, pd.dst_desc(), false, ws);
  plan->bias = pd.bias_desc();
  plan->scratch = make_scratch(pd, ws);
  plan->workspace_bytes = ws.bytes();
  return plan;
}

std::shared_ptr<const BackwardPlan> create_backward(const Key& k) {
  const Descs d = descs(k);
  // The backward primitives take the forward descriptor as a hint for their layouts.
  const auto hint = forward_pd(k, k.bias);
  auto plan = std::make_shared<BackwardPlan>();
  WorkspaceLayout ws;
  if (k.part & 2) {
    const dnnl::convolution_backward_data::desc desc(
        kAlgorithm, any(d.src), any(d.wei, operand_type(k)), any(d.dst, operand_type(k)), d.strides,
        d.pad_l, d.pad_r);
    const dnnl::convolution_backward_data::primitive_desc pd(desc, user_scratchpad(), cpu_engine(),
                                                             hint);
    plan->data = dnnl::convolution_backward_data(pd);
    plan->data_dst = make_operand(d.dst, Tag::nchw, pd.diff_dst_desc(), true, ws);
    plan->data_wei = make_operand(d.wei, Tag::oihw, pd.weights_desc(), true, ws);
    plan->data_src = make_operand(d.src, Tag::nchw, pd.diff_src_desc(), false, ws);
    plan->data_scratch = make_scratch(pd, ws);
  }
  if (k.part & 4) {
    const dnnl::convolution_backward_weights::desc desc(
        kAlgorithm, any(d.src, operand_type(k)), any(d.wei),
        (k.part & 8) ? memory::desc(d.bias, kF32, Tag::x) : memory::desc(),
        any(d.dst, operand_type(k)), d.strides, d.pad_l, d.pad_r);
    const dnnl::convolution_backward_weights::primitive_desc pd(desc, user_scratchpad(),
                                                                cpu_engine(), hint);
    plan->weights = dnnl::convolution_backward_weights(pd);
    plan->weights_src = make_operand(d.src, Tag::nchw, pd.src_desc(), true, ws);
    // grad_y in the weights primitive's layout: usually the same as the data primitive's, in
    // which case the backward reuses that copy instead of reordering grad_y twice.
    plan->weights_dst = make_operand(d.dst, Tag::nchw, pd.diff_dst_desc(), true, ws,
                                     (k.part & 2) ? &plan->data_dst : nullptr);
    plan->weights_wei = make_operand(d.wei, Tag::oihw, pd.diff_weights_desc(), false, ws);
    plan->bias = pd.diff_bias_desc();
    plan->weights_scratch = make_scratch(pd, ws);
  }
  plan->workspace_bytes = ws.bytes();
  return plan;
}

// Plans by key, created once. Failed creations (shapes no oneDNN implementation accepts) are
// cached as null so the caller's fallback does not pay for a failed JIT attempt on every call.
// The cache is small: if varying shapes (e.g. evaluation batch sizes) ever fill it, it is simply
// emptied; plans in use stay alive through their shared_ptr.
template <typename Plan>
class PlanCache {
 public:
  using Create = std::shared_ptr<const Plan> (*)(const Key&);

  std::shared_ptr<const Plan> get(const Key& k, Create create) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = plans_.find(k);
      if (it != plans_.end()) return check(it->second);
    }
    // Created outside the lock (JIT compilation takes milliseconds); a racing thread may create
    // the same plan, and the first one stored wins.
    std::shared_ptr<const Plan> plan;
    try {
      plan = create(k);
    } catch (const dnnl::error&) {
      plan = nullptr;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (plans_.size() >= kMaxPlans) plans_.clear();
    return check(plans_.emplace(k, plan).first->second);
  }

 private:
  static constexpr std::size_t kMaxPlans = 64;
  static std::shared_ptr<const Plan> check(const std::shared_ptr<const Plan>& p) {
    if (!p) throw dnnl::error(dnnl_unimplemented, "conv2d: no oneDNN convolution for this shape");
    return p;
  }
  std::mutex mu_;
  std::map<Key, std::shared_ptr<const Plan>> plans_;
};

// The engine is constructed before the caches so that, statics being destroyed in reverse order,
// the cached primitives are destroyed while their engine still exists.
PlanCache<ForwardPlan>& forward_cache() {
  cpu_engine();
  static PlanCache<ForwardPlan> cache;
  return cache;
}
PlanCache<BackwardPlan>& backward_cache() {
  cpu_engine();
  static PlanCache<BackwardPlan> cache;
  return cache;
}

// oneDNN memory objects take a non-const handle even for read-only arguments.
void* handle(const float* p) { return const_cast<float*>(p); }

// The primitive-layout memory for an input: the user's buffer itself, or a reordered copy.
memory input(const Operand& o, const float* data, char* workspace, dnnl::stream& s) {
  memory user(o.user, cpu_engine(), handle(data));
  if (!o.converted()) return user;
  memory prim(o.prim, cpu_engine(), workspace + o.offset);
  o.reorder.execute(s, user, prim);
  return prim;
}

// The primitive-layout memory for an output; finish_output() copies it to the user's buffer.
memory output(const Operand& o, float* data, char* workspace) {
  return o.converted() ? memory(o.prim, cpu_engine(), workspace + o.offset)
                       : memory(o.user, cpu_engine(), data);
}
void finish_output(const Operand& o, memory prim, float* data, dnnl::stream& s) {
  if (!o.converted()) return;
  memory user(o.user, cpu_engine(), data);
  o.reorder.execute(s, prim, user);
}

void add_scratch(std::unordered_map<int, memory>& args, const Scratch& sc, char* workspace) {
  if (sc.desc.get_size() > 0) {
    args[DNNL_ARG_SCRATCHPAD] = memory(sc.desc, cpu_engine(), workspace + sc.offset);
  }
}

Tensor workspace(std::size_t bytes, Device& device) {
  const auto floats = static_cast<std::int64_t>((bytes + sizeof(float) - 1) / sizeof(float));
  return Tensor::empty({std::max<std::int64_t>(floats, 1)}, DType::F32, device);
}

}  // namespace

namespace {

// The forward convolution into `dst`, the primitive-layout output (the workspace's, or y itself).
void execute_forward(const ForwardPlan& plan, const Tensor& x, const Tensor& w, const Tensor& bias,
                     char* base, const memory& dst, dnnl::stream& s) {
  std::unordered_map<int, memory> args;
  args[DNNL_ARG_SRC] = input(plan.src, x.data<float>(), base, s);
  args[DNNL_ARG_WEIGHTS] = input(plan.wei, w.data<float>(), base, s);
  if (bias.defined())
    args[DNNL_ARG_BIAS] = memory(plan.bias, cpu_engine(), handle(bias.data<float>()));
  args[DNNL_ARG_DST] = dst;
  add_scratch(args, plan.scratch, base);
  plan.conv.execute(s, args);
}

// aBcd16b: the channel-blocked layout pool_blocked.h reads and writes.
memory::desc channel_blocks(const memory::dims& dims, memory::data_type type) {
  return memory::desc(dims, type, Tag::aBcd16b);
}

// Whether pool_blocked.h's kernels run this pooling of this convolution's output (they gather
// with 32-bit offsets across 16 planes).
bool pools_blocks(const Pool2dParams& p, const Key& k) {
  return p.kernel_h == 2 && p.kernel_w == 2 && p.stride_h == 2 && p.stride_w == 2 && p.pad_h == 0 &&
         p.pad_w == 0 && out_h(k) >= 2 && out_w(k) >= 2 &&
         out_h(k) * out_w(k) * 16 < (std::int64_t{1} << 28) && channel_block_pooling_available();
}

}  // namespace

Tensor conv2d_forward_dnnl(const Tensor& x, const Tensor& w, const Tensor& bias,
                           const Conv2dParams& p) {
  const Key k = make_key(x, w, p, p.relu ? 16 : 0, bias.defined());
  if (bias.defined()) check_shape(bias, Shape{k.oc}, "conv2d bias");
  const auto plan = forward_cache().get(k, create_forward);
  Tensor y = Tensor::empty({k.n, k.oc, out_h(k), out_w(k)}, DType::F32, x.device());
  Tensor ws = workspace(plan->workspace_bytes, x.device());
  char* base = static_cast<char*>(ws.raw_data());
  dnnl::stream& s = thread_stream();
  const memory dst = output(plan->dst, y.data<float>(), base);
  execute_forward(*plan, x, w, bias, base, dst, s);
  finish_output(plan->dst, dst, y.data<float>(), s);
  s.wait();
  return y;
}

Tensor conv2d_relu_max_pool2d_forward_dnnl(const Tensor& x, const Tensor& w, const Tensor& bias,
                                           const Conv2dParams& params, const Pool2dParams& pool,
                                           Tensor& argmax) {
  Conv2dParams p = params;
  p.relu = true;
  const Key k = make_key(x, w, p, 16, bias.defined());
  if (bias.defined()) check_shape(bias, Shape{k.oc}, "conv2d bias");
  const auto plan = forward_cache().get(k, create_forward);
  if (!pools_blocks(pool, k) || plan->dst.prim != channel_blocks(descs(k).dst, operand_type(k)) ||
      !plan->dst.converted()) {
    return max_pool2d_forward(conv2d_forward_dnnl(x, w, bias, p), pool, argmax);
  }
  Tensor ws = workspace(plan->workspace_bytes, x.device());
  char* base = static_cast<char*>(ws.raw_data());
  dnnl::stream& s = thread_stream();
  execute_forward(*plan, x, w, bias, base,
                  memory(plan->dst.prim, cpu_engine(), base + plan->dst.offset), s);
  s.wait();
  Tensor pooled = Tensor::empty({k.n, k.oc, out_h(k) / 2, out_w(k) / 2}, DType::F32, x.device());
  argmax = Tensor::empty(pooled.shape(), DType::I32, x.device());
  const char* y = base + plan->dst.offset;
  if (k.bf16) {
    max_pool_2x2_from_channel_blocks_bf16(reinterpret_cast<const std::uint16_t*>(y), k.n, k.oc,
                                          out_h(k), out_w(k), pooled.data<float>(),
                                          argmax.data<std::int32_t>());
  } else {
    max_pool_2x2_from_channel_blocks(reinterpret_cast<const float*>(y), k.n, k.oc, out_h(k),
                                     out_w(k), pooled.data<float>(), argmax.data<std::int32_t>());
  }
  return pooled;
}

namespace {

// grad_x and grad_w (with grad_bias) from grad_y: `given`, already in the primitives' layout, or
// the user's plain `grad_y` converted here.
void execute_backward(const BackwardPlan& plan, const Key& k, const memory* given,
                      const Tensor& grad_y, const Tensor& x, const Tensor& w, Tensor* grad_x,
                      Tensor* grad_w, Tensor* grad_bias, char* base, dnnl::stream& s) {
  memory gy_data;  // grad_y in the data primitive's layout, reused by the weights primitive
  if (grad_x) {
    *grad_x = Tensor::empty(x.shape(), DType::F32, x.device());
    gy_data = given ? *given : input(plan.data_dst, grad_y.data<float>(), base, s);
    const memory dx = output(plan.data_src, grad_x->data<float>(), base);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_DIFF_DST, gy_data},
        {DNNL_ARG_WEIGHTS, input(plan.data_wei, w.data<float>(), base, s)},
        {DNNL_ARG_DIFF_SRC, dx}};
    add_scratch(args, plan.data_scratch, base);
    plan.data.execute(s, args);
    finish_output(plan.data_src, dx, grad_x->data<float>(), s);
  }
  if (grad_w) {
    *grad_w = Tensor::empty(w.shape(), DType::F32, x.device());
    if (grad_bias) *grad_bias = Tensor::empty({k.oc}, DType::F32, x.device());
    const memory gy = given ? *given
                      : grad_x && plan.weights_dst.prim == plan.data_dst.prim
                          ? gy_data
                          : input(plan.weights_dst, grad_y.data<float>(), base, s);
    const memory dw = output(plan.weights_wei, grad_w->data<float>(), base);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, input(plan.weights_src, x.data<float>(), base, s)},
        {DNNL_ARG_DIFF_DST, gy},
        {DNNL_ARG_DIFF_WEIGHTS, dw}};
    if (grad_bias)
      args[DNNL_ARG_DIFF_BIAS] = memory(plan.bias, cpu_engine(), grad_bias->data<float>());
    add_scratch(args, plan.weights_scratch, base);
    plan.weights.execute(s, args);
    finish_output(plan.weights_wei, dw, grad_w->data<float>(), s);
  }
  s.wait();
}

int backward_part(const Tensor* grad_x, const Tensor* grad_w, const Tensor* grad_bias) {
  return 1 | (grad_x ? 2 : 0) | (grad_w ? 4 : 0) | (grad_w && grad_bias ? 8 : 0);
}

}  // namespace

void conv2d_backward_dnnl(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                          const Conv2dParams& p, Tensor* grad_x, Tensor* grad_w,
                          Tensor* grad_bias) {
  // oneDNN computes the bias gradient only alongside the weights gradient; alone it is a plain
  // sum over (N, OH, OW), done below.
  const Key k = make_key(x, w, p, backward_part(grad_x, grad_w, grad_bias), false);
  check_shape(grad_y, Shape{k.n, k.oc, out_h(k), out_w(k)}, "conv2d grad_y");
  if (grad_bias && !grad_w) {
    const std::int64_t P = out_h(k) * out_w(k);
    *grad_bias = Tensor::zeros({k.oc}, DType::F32, x.device());
    float* pb = grad_bias->data<float>();
    const float* pg = grad_y.data<float>();
    for (std::int64_t n = 0; n < k.n; ++n)
      for (std::int64_t o = 0; o < k.oc; ++o) {
        const float* row = pg + (n * k.oc + o) * P;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (std::int64_t i = 0; i < P; ++i) acc += row[i];
        pb[o] += acc;
      }
  }
  if (!grad_x && !grad_w) return;
  const auto plan = backward_cache().get(k, create_backward);
  Tensor ws = workspace(plan->workspace_bytes, x.device());
  execute_backward(*plan, k, nullptr, grad_y, x, w, grad_x, grad_w, grad_bias,
                   static_cast<char*>(ws.raw_data()), thread_stream());
}

void conv2d_relu_max_pool2d_backward_dnnl(const Tensor& grad_pooled, const Tensor& argmax,
                                          const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                          const Pool2dParams& pool, Tensor* grad_x, Tensor* grad_w,
                                          Tensor* grad_bias) {
  const Key k = make_key(x, w, p, backward_part(grad_x, grad_w, grad_bias), false);
  const Shape y_shape{k.n, k.oc, out_h(k), out_w(k)};
  const auto apart = [&] {
    conv2d_backward_dnnl(max_pool2d_backward(grad_pooled, argmax, y_shape), x, w, p, grad_x, grad_w,
                         grad_bias);
  };
  if ((!grad_x && !grad_w) || (grad_bias && !grad_w) || !pools_blocks(pool, k)) return apart();
  check_shape(grad_pooled, Shape{k.n, k.oc, out_h(k) / 2, out_w(k) / 2}, "conv2d pooled grad");
  const auto plan = backward_cache().get(k, create_backward);
  // The unpooled gradient goes straight into the primitives' grad_y layout, when they share a
  // channel-blocked one (equal layouts share one copy: make_operand): no plain copy of it, and no
  // reorder.
  const memory::desc blocked = channel_blocks(descs(k).dst, operand_type(k));
  const auto takes_blocks = [&](const Operand& o) { return o.prim == blocked && o.converted(); };
  if ((grad_x && !takes_blocks(plan->data_dst)) || (grad_w && !takes_blocks(plan->weights_dst))) {
    return apart();
  }
  Tensor ws = workspace(plan->workspace_bytes, x.device());
  char* base = static_cast<char*>(ws.raw_data());
  char* gy = base + (grad_x ? plan->data_dst.offset : plan->weights_dst.offset);
  if (k.bf16) {
    max_unpool_2x2_to_channel_blocks_bf16(grad_pooled.data<float>(), argmax.data<std::int32_t>(),
                                          k.n, k.oc, out_h(k), out_w(k),
                                          reinterpret_cast<std::uint16_t*>(gy));
  } else {
    max_unpool_2x2_to_channel_blocks(grad_pooled.data<float>(), argmax.data<std::int32_t>(), k.n,
                                     k.oc, out_h(k), out_w(k), reinterpret_cast<float*>(gy));
  }
  const memory given(blocked, cpu_engine(), gy);
  execute_backward(*plan, k, &given, grad_pooled, x, w, grad_x, grad_w, grad_bias, base,
                   thread_stream());
}

}  // namespace hpm::cpu
