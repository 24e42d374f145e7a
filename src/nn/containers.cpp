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

}  // namespace hpm::nn
