#include "hpm/autograd/node.h"

#include <atomic>
#include <mutex>
#include <stdexcept>

#include "hpm/autograd/autocast.h"
#include "hpm/autograd/grad_mode.h"
#include "hpm/tensor/kernels.h"

namespace hpm::autograd {

namespace {
std::atomic<std::uint64_t> next_sequence_nr{0};
thread_local bool grad_mode = true;
}  // namespace

bool grad_enabled() { return grad_mode; }
void set_grad_enabled(bool on) { grad_mode = on; }

Node::Node() : sequence_nr(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

Tensor accumulate_into(const Tensor& leaf) {
  if (!leaf.defined() || !leaf.requires_grad() || !leaf.is_leaf()) return Tensor();
  const AutogradMeta& meta = *leaf.impl()->autograd;
  // A leaf with an accumulation lock (a weight tied across pipeline stages on threads) has its
  // gradient written by another thread under that lock: not even its presence may be read here.
  if (meta.accumulate_lock) return Tensor();
  if (!meta.grad || !meta.post_accumulate_hooks.empty() || meta.grad_is_stale) return Tensor();
  if (meta.grad.use_count() != 1 || meta.grad->storage.use_count() != 1 || meta.grad->offset != 0) {
    return Tensor();
  }
  return Tensor(meta.grad);
}

Tensors AccumulateGrad::apply(Tensors&& grad_outputs) {
  Tensor& g = grad_outputs.at(0);
  if (!g.defined()) return {};
  AutogradMeta& meta = *variable_->autograd;
  std::unique_lock<std::mutex> lock;
  if (meta.accumulate_lock) lock = std::unique_lock<std::mutex>(*meta.accumulate_lock);
  if (!meta.grad) {
    // Steal the incoming buffer when nothing else can see it; otherwise keep a private copy so
    // that accumulating into one leaf's grad never changes another's.
    const bool exclusive = g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1 &&
                           g.impl()->offset == 0;
    Tensor owned = exclusive ? g : g.clone();
    owned.impl()->autograd.reset();
    owned = owned.reshape(variable_->shape);
    meta.grad = owned.impl_ptr();
  } else if (meta.grad_is_stale) {
    Tensor(meta.grad).copy_(g.reshape(variable_->shape));
    meta.grad_is_stale = false;
  } else {
    Tensor acc(meta.grad);
    kernels::axpy_(acc, 1.0f, g);
  }
  if (!meta.post_accumulate_hooks.empty()) {
    Tensor var(variable_);
    for (auto& hook : meta.post_accumulate_hooks) hook(var);
  }
  return {};
}

Tensors FunctionNode::apply(Tensors&& grad_outputs) {
  if (!fn_) {
    throw std::logic_error(std::string("backward through ") + name_ +
                           " a second time: its saved tensors were freed after the first backward");
  }
  if (!grad_outputs.at(0).defined()) {
    fn_ = nullptr;
    return Tensors(next_edges.size());
  }
  std::vector<bool> needs(next_edges.size());
  for (std::size_t i = 0; i < next_edges.size(); ++i) needs[i] = next_edges[i].valid();
  Tensors grads = fn_(grad_outputs.at(0), needs);
  fn_ = nullptr;
  return grads;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  auto& meta = *t.impl()->autograd;
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

Tensor record(const char* name, const Tensors& inputs, Tensor output, BackwardFn backward,
              Bf16Grad bf16_grad) {
  if (!grad_enabled()) return output;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return output;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->bf16_grad = bf16_grad;
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(gradient_edge(t));
  AutogradMeta& meta = output.autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = std::move(node);
  meta.output_nr = 0;
  return output;
}

bool bf16_gradient_taken(const Tensor& t) {
  if (!bf16_fusions() || !t.defined() || !t.impl()->autograd) return false;
  const Node* fn = t.impl()->autograd->grad_fn.get();
  while (fn != nullptr && fn->is_view()) {
    fn = fn->next_edges[0].fn.get();
  }
  return fn != nullptr && fn->bf16_grad == Bf16Grad::kTaken;
}

namespace {

// Whether a gradient reaching `fn` unchanged reaches a taker of bf16 gradients: through views
// (kPassedOn), and through nodes that hand it on as it is (a residual stream's sum), a few nodes
// deep.
bool reaches_taker(const Node* fn, int depth) {
  if (fn == nullptr || depth > 8) return false;
  if (fn->bf16_grad == Bf16Grad::kTaken) return true;
  if (!fn->is_view() && !fn->hands_gradient_on) return false;
  for (const Edge& e : fn->next_edges) {
    if (reaches_taker(e.fn.get(), depth + 1)) return true;
  }
  return false;
}

}  // namespace

bool bf16_copy_wanted(const Tensor& t) {
  if (!bf16_gradient_copies() || !t.defined() || !t.impl()->autograd) return false;
  return reaches_taker(t.impl()->autograd->grad_fn.get(), 0);
}

}  // namespace hpm::autograd
