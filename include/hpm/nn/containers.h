// Containers beyond Sequential (module.h): a list of modules that is not itself a computation,
// and a residual connection.
#pragma once
#include <memory>
#include <vector>

#include "hpm/nn/module.h"

namespace hpm::nn {

// Modules held in order and named "0", "1", ... (torch.nn.ModuleList): a model's blocks, whose
// forward the owner writes. It has no forward of its own.
class ModuleList : public Module {
 public:
  ModuleList() = default;
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> m);
  std::size_t size() const { return children().size(); }
  const std::shared_ptr<Module>& operator[](std::size_t i) const { return children()[i].second; }
  Tensor forward(const Tensor& x) override;  // throws: a list is not a computation
  std::string type_name() const override { return "ModuleList"; }
};

// x + f(x). The residual stays inside the module, so a model cut into blocks never splits a
// skip connection between two blocks.
class Residual : public Module {
 public:
  explicit Residual(std::shared_ptr<Module> f);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Residual"; }

 private:
  std::shared_ptr<Module> f_;
};

}  // namespace hpm::nn
