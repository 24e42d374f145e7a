#include "hpm/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/node.h"
#include "hpm/autograd/ops.h"
#include "hpm/tensor/random.h"

namespace hpm::autograd {

namespace {
std::set<std::string>& covered() {
  static std::set<std::string> s;
  return s;
}

void collect_names(const std::shared_ptr<Node>& root) {
  std::vector<Node*> stack{root.get()};
  std::set<Node*> seen;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (n->name() != "AccumulateGrad") covered().insert(n->name());
    for (auto& e : n->next_edges) stack.push_back(e.fn.get());
  }
}

double weighted_sum(const Tensor& out, const Tensor& w) {
  const std::vector<float> po = out.to_vector(), pw = w.to_vector();
  double s = 0.0;
  for (std::size_t i = 0; i < po.size(); ++i) s += static_cast<double>(po[i]) * pw[i];
  return s;
}
}  // namespace

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> names = {
      "Add",       "Sub",     "Mul",        "Div",           "AddScalar", "MulScalar",  "Neg",
      "Exp",       "Log",     "Sqrt",       "Square",        "Relu",      "Tanh",       "Sigmoid",
      "Gelu",      "Sum",     "SumDim",     "Reshape",       "Transpose", "Permute",    "MatMul",
      "Linear",    "Conv2d",  "MaxPool2d",  "AvgPool2d",     "BatchNorm", "Conv2dRelu", "LayerNorm",
      "Embedding", "Softmax", "LogSoftmax", "CrossEntropy",  "NllLoss",   "KlDiv",      "Narrow",
      "Concat",    "Where",   "MaskedFill", "BatchedMatMul", "Attention"};
  return names;
}

const std::set<std::string>& gradcheck_covered() { return covered(); }

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  GradcheckResult result;
  // Analytic: backward of sum(out * w).
  for (const auto& t : inputs)
    if (t.requires_grad()) t.impl()->autograd->grad.reset();
  Tensor out = fn(inputs);
  if (out.grad_fn()) collect_names(out.grad_fn());
  Generator gen(1234);
  Tensor w = Tensor::uniform(out.shape(), gen, 0.5f, 1.5f);
  out.backward(w);

  NoGradGuard no_grad;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    const std::vector<float> analytic =
        x.grad().defined() ? x.grad().to_vector() : std::vector<float>(x.numel(), 0.0f);
    std::vector<float> values = x.to_vector();
    // x's element i set to `v` (in place: fn reads x itself).
    const auto set = [&](std::int64_t i, float v) {
      values[static_cast<std::size_t>(i)] = v;
      Tensor(x).copy_(Tensor::from(values, x.shape(), x.device()));
    };
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const float orig = values[static_cast<std::size_t>(i)];
      set(i, orig + options.eps);
      const double plus = weighted_sum(fn(inputs), w);
      set(i, orig - options.eps);
      const double minus = weighted_sum(fn(inputs), w);
      set(i, orig);
      const auto numeric = static_cast<float>((plus - minus) / (2.0 * options.eps));
      const float a = analytic[static_cast<std::size_t>(i)];
      const float err = std::fabs(a - numeric);
      result.max_abs_error = std::max(result.max_abs_error, err);
      if (result.ok && err > options.atol + options.rtol * std::fabs(numeric)) {
        std::ostringstream os;
        os << "input " << k << " element " << i << ": analytic " << a << " vs numeric " << numeric;
        result.ok = false;
        result.message = os.str();
      }
    }
  }
  return result;
}

}  // namespace hpm::autograd
