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

// `model`'s parameters, buffers and children under the model's own names (its state_dict), run by
// `runner`: a model whose blocks are wrapped for recomputation or offload (which name them by
// block index) keeps the checkpoint names of the plain model, so either loads the other's.
class RunAs : public Module {
 public:
  RunAs(std::shared_ptr<Module> model, std::shared_ptr<Module> runner);
  Tensor forward(const Tensor& x) override { return runner_->forward(x); }
  std::vector<std::shared_ptr<Module>> blocks() const override { return model_->blocks(); }
  std::string type_name() const override { return model_->type_name(); }
  std::string extra_repr() const override { return runner_->extra_repr(); }

 private:
  std::shared_ptr<Module> model_, runner_;
};

// softmax(scale q k^T) v as a module of three inputs (q, k, v: (..., T, D), (..., S, D)), the fused
// op of autograd/ops.h; forward(x) is self-attention, q = k = v = x.
class Attention : public Module {
 public:
  explicit Attention(bool causal = false, float scale = 0.0f) : causal_(causal), scale_(scale) {}
  Tensor forward(const Tensor& x) override { return forward_inputs({x, x, x}); }
  Tensor forward_inputs(const std::vector<Tensor>& qkv) override;
  std::string type_name() const override { return "Attention"; }
  std::string extra_repr() const override { return causal_ ? "causal=true" : "causal=false"; }

 private:
  bool causal_;
  float scale_;
};

}  // namespace hpm::nn
