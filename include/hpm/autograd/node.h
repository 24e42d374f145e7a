// The autograd graph. Each differentiable op that sees an input requiring grad creates a Node that
// knows how to map the gradient of its output to gradients of its inputs; edges point to the
// nodes that produced those inputs (or to a leaf's AccumulateGrad). Tensor::backward walks the
// graph in reverse topological order (see engine.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hpm/tensor/tensor.h"

namespace hpm::autograd {

using Tensors = std::vector<Tensor>;

class Node;

// What a node does with a BF16 gradient. A rule of bf16 autocast may return one for an input
// (cheaper to write, and its consumer rounds it anyway) only where bf16_gradient_taken says that
// it reaches a kTaken node; the engine widens BF16 gradients for every other node, and where two
// meet in a sum.
enum class Bf16Grad : std::uint8_t {
  kWidened,   // widened to f32 by the engine first (every node but those below)
  kTaken,     // taken as it is: a bf16 product's rule, which rounds its gradient to bf16 anyway
  kPassedOn,  // handed on as it is to the node's one input: a view's rule (Reshape)
};

struct Edge {
  std::shared_ptr<Node> fn;  // null when the input needs no gradient
  int input_nr = 0;          // which of fn's outputs this edge carries
  bool valid() const { return fn != nullptr; }
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients of the inputs (one per next edge; undefined where not needed) from the gradients
  // of the outputs.
  virtual Tensors apply(Tensors&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  virtual int num_outputs() const { return 1; }

  std::vector<Edge> next_edges;
  // Creation order: the engine runs later nodes first, which keeps execution deterministic.
  std::uint64_t sequence_nr;
  Bf16Grad bf16_grad = Bf16Grad::kWidened;
  // A view's node: it hands its gradient on as it is to its one input (kPassedOn).
  bool is_view() const { return bf16_grad == Bf16Grad::kPassedOn && next_edges.size() == 1; }
  // Its rule hands the gradient it receives to every input as it is (the same tensor: a residual
  // stream's sum), which bf16_copy_wanted looks through.
  bool hands_gradient_on = false;
};

// Sink of a leaf tensor: adds the incoming gradient into tensor.grad, then runs its hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> variable) : variable_(std::move(variable)) {}
  Tensors apply(Tensors&& grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::shared_ptr<TensorImpl> variable_;
};

// A node whose backward is a closure over the tensors it saved in forward. `needs[i]` tells
// whether input i wants a gradient, so a rule can skip work (the first layer's input gradient).
using BackwardFn =
    std::function<Tensors(const Tensor& grad_output, const std::vector<bool>& needs)>;

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  Tensors apply(Tensors&& grad_outputs) override;
  std::string name() const override { return name_; }

 private:
  const char* name_;
  BackwardFn fn_;  // released after one backward: the saved tensors go with it
};

// For gradient rules that can add their result straight into a leaf's gradient (a GEMM with
// beta = 1) instead of returning it for AccumulateGrad to add in a second pass over memory: the
// leaf's gradient buffer when that is the same thing (a leaf that already holds a gradient no one
// else sees, and has no post-accumulate hooks to run), else an undefined tensor. Micro-batches
// (accumulation, pipelines) otherwise pay a full read-add-write of every weight gradient each.
Tensor accumulate_into(const Tensor& leaf);

// The edge through which gradient flows into `t`: its grad_fn, or its leaf accumulator.
Edge gradient_edge(const Tensor& t);

// Attaches `output` to a new FunctionNode over `inputs` when grad mode is on and any input
// requires grad; returns `output` either way. This is how every differentiable op records itself.
Tensor record(const char* name, const Tensors& inputs, Tensor output, BackwardFn backward,
              Bf16Grad bf16_grad = Bf16Grad::kWidened);

// Inside a gradient rule that the engine runs: the gradient already summed for the rule's input
// `input` (from that input's consumers that ran before this one: in a residual stream, the skip
// path's), taken out of the engine so that the rule's kernel adds its own into it in place (see
// kernels::layer_norm_backward) instead of returning a second one for the engine to add in a pass
// of its own; found through views that hand their gradient on (kPassedOn: a Reshape), and
// returned in `shape`. Undefined when there is none, or it is not an F32 tensor of shape's size
// that only the engine holds (a view, or a tensor another gradient shares, is never handed out).
// A rule that takes it must return it, with its own gradient added, as that input's gradient.
Tensor take_pending_gradient(std::size_t input, const Shape& shape);

// Whether a BF16 gradient for t would reach, through kPassedOn nodes only, a node that takes it
// (Bf16Grad::kTaken): false for a leaf or a tensor outside the graph.
bool bf16_gradient_taken(const Tensor& t);

// A residual stream's gradient rounded to bf16 by the kernel that wrote it, for the bf16 product
// that rounds it next (in a GPT block, the norm's backward adds its dx into the stream's gradient,
// and the product before it would round that sum in a pass of its own). The four below:

// Whether t's gradient, handed on unchanged (views, and the sum of a residual stream, "Add"),
// reaches a node that takes bf16 gradients, and copies are on (bf16_gradient_copies): a rule
// decides at its forward whether to make the copy.
bool bf16_copy_wanted(const Tensor& t);
// Inside a gradient rule that the engine runs: whether the gradient the rule returns for input
// `input` completes that input's (no other consumer's is still to come, through views), so that a
// copy of it is a copy of what the input's producer receives.
bool completes_gradient(std::size_t input);
// Offers `bf16`, the rounding of `gradient`, to the rule that rounds `gradient` next. Held, with
// `gradient`'s memory (which no rule may then take to add into in place: take_pending_gradient
// refuses a tensor another holds), until taken or until the backward ends.
void offer_bf16_copy(const Tensor& gradient, Tensor bf16);
// to_bf16(g) for a bf16 product's rule: the copy offered for g's elements (the same memory, offset
// and size), taken, or a rounding now.
Tensor bf16_gradient(const Tensor& g);
// How many offered copies the calling thread's last backward ended with, untaken (each held its
// gradient's memory to the end: a rule offered one that no product took).
std::size_t bf16_copies_left_by_last_backward();

}  // namespace hpm::autograd
