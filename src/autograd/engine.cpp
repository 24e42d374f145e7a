// The backward engine: counts each node's dependencies, then runs nodes whose gradients are
// complete, latest-created first, summing gradients that arrive along several edges (in f32, or
// in a rule's kernel: take_pending_gradient), and widening a BF16 gradient for a node that does
// not take one (node.h's Bf16Grad).
#include <queue>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/node.h"
#include "hpm/tensor/kernels.h"

namespace hpm {

namespace {

// A BF16 gradient (Bf16Grad) as f32; any other as it is.
Tensor widened(const Tensor& g) {
  return g.defined() && g.dtype() == DType::BF16 ? kernels::to_f32(g) : g;
}

using PendingGradients = std::unordered_map<autograd::Node*, autograd::Tensors>;
using Dependencies = std::unordered_map<autograd::Node*, int>;
// Gradients offered with their bf16 copies (offer_bf16_copy), until taken.
using Bf16Copies = std::vector<std::pair<Tensor, Tensor>>;

// The node the engine runs on this thread, the gradients pending for every node (what
// take_pending_gradient reads), the edges each node still waits for, and the bf16 copies on
// offer. Restored on exit (a rule may run a backward of its own).
struct Running {
  autograd::Node* node = nullptr;
  PendingGradients* pending = nullptr;
  Dependencies* deps = nullptr;
  Bf16Copies* copies = nullptr;
};
thread_local Running running;
thread_local std::size_t copies_left = 0;

class RunningScope {
 public:
  explicit RunningScope(const Running& now) : saved_(running) { running = now; }
  ~RunningScope() { running = saved_; }
  RunningScope(const RunningScope&) = delete;
  RunningScope& operator=(const RunningScope&) = delete;

 private:
  Running saved_;
};

}  // namespace

namespace autograd {

Tensor take_pending_gradient(std::size_t input, const Shape& shape) {
  if (running.node == nullptr || input >= running.node->next_edges.size()) return Tensor();
  Edge e = running.node->next_edges[input];
  // Through views that hand their gradient on (a Reshape: Linear's rows of a (B, T, E) stream) to
  // where the other consumers' sum waits: at the first node on the way where a gradient waits for
  // the same tensor's values, a view (a stream made by a reshape of a product's rows, whose other
  // consumers' gradients meet at the reshape) or not. The rule's gradient, handed back on through
  // the views before it, then meets no sum there.
  Tensor* slot = nullptr;
  while (e.valid()) {
    const auto it = running.pending->find(e.fn.get());
    if (it != running.pending->end()) {
      Tensor& here = it->second.at(static_cast<std::size_t>(e.input_nr));
      if (here.defined()) {
        slot = &here;
        break;
      }
    }
    if (!e.fn->is_view()) break;
    e = e.fn->next_edges[0];
  }
  if (slot == nullptr || slot->dtype() != DType::F32 || slot->numel() != shape.numel()) {
    return Tensor();
  }
  if (slot->impl_ptr().use_count() != 1 || slot->impl()->storage.use_count() != 1 ||
      slot->impl()->offset != 0) {
    return Tensor();
  }
  return std::exchange(*slot, Tensor()).reshape(shape);
}

bool completes_gradient(std::size_t input) {
  if (running.node == nullptr || running.deps == nullptr ||
      input >= running.node->next_edges.size()) {
    return false;
  }
  Edge e = running.node->next_edges[input];
  while (e.valid()) {
    const auto it = running.deps->find(e.fn.get());
    if (it == running.deps->end() || it->second != 1) return false;  // others still to come
    if (!e.fn->is_view()) return true;
    e = e.fn->next_edges[0];
  }
  return false;
}

void offer_bf16_copy(const Tensor& gradient, Tensor bf16) {
  if (running.copies == nullptr || !gradient.defined() || !bf16.defined()) return;
  running.copies->emplace_back(gradient, std::move(bf16));
}

Tensor bf16_gradient(const Tensor& g) {
  if (running.copies != nullptr && g.defined() && g.dtype() == DType::F32) {
    Bf16Copies& copies = *running.copies;
    for (auto it = copies.begin(); it != copies.end(); ++it) {
      const Tensor& offered = it->first;
      if (offered.impl()->storage == g.impl()->storage &&
          offered.impl()->offset == g.impl()->offset && offered.numel() == g.numel()) {
        Tensor copy = it->second.reshape(g.shape());
        copies.erase(it);  // and with it the hold on the gradient's memory
        return copy;
      }
    }
  }
  return kernels::to_bf16(g);
}

std::size_t bf16_copies_left_by_last_backward() { return copies_left; }

}  // namespace autograd

void Tensor::backward(const Tensor& grad_output) const {
  using namespace autograd;
  if (!requires_grad()) {
    throw std::logic_error("backward() on a tensor that does not require grad and has no grad_fn");
  }
  Tensor seed = grad_output;
  if (!seed.defined()) {
    if (numel() != 1) {
      throw std::logic_error("backward() without a gradient needs a scalar output, got shape " +
                             shape().str());
    }
    seed = Tensor::ones(shape(), device());
  } else {
    check_shape(seed, shape(), "backward: grad_output");
  }
  const Edge root = gradient_edge(*this);
  NoGradGuard no_grad;  // gradient rules compute plain tensors

  Dependencies deps;
  Bf16Copies copies;
  {
    std::vector<Node*> stack{root.fn.get()};
    deps[root.fn.get()] = 0;
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.valid()) continue;
        auto [it, inserted] = deps.try_emplace(e.fn.get(), 0);
        ++it->second;
        if (inserted) stack.push_back(e.fn.get());
      }
    }
  }

  struct Later {
    bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
  };
  std::priority_queue<Node*, std::vector<Node*>, Later> ready;
  std::unordered_map<Node*, Tensors> inputs;
  inputs[root.fn.get()].resize(static_cast<std::size_t>(root.fn->num_outputs()));
  inputs[root.fn.get()][static_cast<std::size_t>(root.input_nr)] = seed;
  ready.push(root.fn.get());

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    Tensors grads_in = std::move(inputs[node]);
    inputs.erase(node);
    if (node->bf16_grad == Bf16Grad::kWidened) {
      for (Tensor& g : grads_in) g = widened(g);
    }
    Tensors grads_out;
    {
      RunningScope scope(Running{node, &inputs, &deps, &copies});
      grads_out = node->apply(std::move(grads_in));
    }
    for (std::size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      Tensors& buf = inputs[e.fn.get()];
      if (buf.empty()) buf.resize(static_cast<std::size_t>(e.fn->num_outputs()));
      if (i < grads_out.size() && grads_out[i].defined()) {
        Tensor& slot = buf[static_cast<std::size_t>(e.input_nr)];
        if (!slot.defined()) {
          slot = grads_out[i];
        } else {
          // A sum is f32: a BF16 gradient meeting another is widened first.
          slot = kernels::binary(kernels::BinaryOp::Add, widened(slot), widened(grads_out[i]));
        }
      }
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }
  copies_left = copies.size();
}

}  // namespace hpm
