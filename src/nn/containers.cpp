#include "hpm/nn/containers.h"

#include <stdexcept>

namespace hpm::nn {

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(size()), std::move(m));
}

Tensor ModuleList::forward(const Tensor&) {
  throw std::logic_error("ModuleList has no forward: its owner runs the modules it holds");
}

Residual::Residual(std::shared_ptr<Module> f) : f_(register_module("fn", std::move(f))) {}

Tensor Residual::forward(const Tensor& x) { return add(x, f_->forward(x)); }

RunAs::RunAs(std::shared_ptr<Module> model, std::shared_ptr<Module> runner)
    : model_(std::move(model)), runner_(std::move(runner)) {
  if (!model_ || !runner_) throw std::invalid_argument("RunAs: no model or no runner");
  for (const auto& [name, child] : model_->children()) register_module(name, child);
  for (const auto& [name, t] : model_->own_parameters()) register_parameter(name, t);
  for (const auto& [name, t] : model_->own_buffers()) register_buffer(name, t);
  train(model_->is_training());
}

Tensor Attention::forward_inputs(const std::vector<Tensor>& qkv) {
  if (qkv.size() != 3) {
    throw std::invalid_argument("Attention takes three inputs (query, key, value), got " +
                                std::to_string(qkv.size()));
  }
  return scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], causal_, scale_);
}

}  // namespace hpm::nn
