// Module: the unit models are built from, as in torch.nn. A module owns named parameters
// (trainable leaves), buffers (state such as BatchNorm's running statistics) and children; names
// nest with dots ("0.weight"), the same keys PyTorch's state_dict uses, so checkpoints map 1:1.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpm/autograd/ops.h"
#include "hpm/tensor/tensor.h"

namespace hpm::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  // Forward over several tensors (attention's query, key and value). The default takes exactly
  // one and runs forward(x); a module of several inputs overrides it. A different name from
  // forward, so that overriding one never hides the other.
  virtual Tensor forward_inputs(const std::vector<Tensor>& inputs);
  Tensor operator()(const std::vector<Tensor>& inputs) { return forward_inputs(inputs); }

  // The model as a sequence of blocks whose forwards, chained, are its forward: what recompute,
  // offload and the pipeline cut and place (GPT: embeddings, transformer blocks, head; ResNet:
  // stem, residual blocks, head). Residual connections stay inside a block. Empty: the module
  // is one block.
  virtual std::vector<std::shared_ptr<Module>> blocks() const { return {}; }

  virtual std::string type_name() const = 0;  // "Linear"
  virtual std::string extra_repr() const { return ""; }
  std::string repr(int indent = 0) const;  // PyTorch-style printout

  // Each parameter once: one shared by several modules (weight tying) under the first name.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // Parameters then buffers: everything a checkpoint must hold to restore the module. A shared
  // parameter appears under every name it has, as in torch's state_dict.
  NamedTensors state_dict() const;
  // Makes this module's parameter `name` the tensor `value` (same shape and dtype): weight tying.
  // A layer that keeps a member handle (Linear::weight) must be given `value` there too.
  void replace_parameter(const std::string& name, const Tensor& value);
  // Copies values in by name; throws std::invalid_argument naming a missing, unexpected or
  // wrongly-shaped entry (and changes nothing in that case).
  void load_state_dict(const NamedTensors& state);
  // load_state_dict for weights from elsewhere (a file from PyTorch, an export): floating tensors
  // in F16, BF16 or F64 are cast to the model's f32 first. strict: as load_state_dict. Not
  // strict: the model's entries absent from `state` keep their values and are reported as
  // missing, entries the model lacks are reported as unexpected; a shape or a non-floating dtype
  // that does not match is an error either way (std::invalid_argument naming the entry).
  struct LoadReport {
    std::vector<std::string> missing, unexpected;
    std::size_t loaded = 0, cast = 0;  // entries copied in; of those, cast from another precision
  };
  LoadReport load_weights(const NamedTensors& state, bool strict = true);
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  // This module's own parameters and buffers, without its children's.
  const NamedTensors& own_parameters() const { return params_; }
  const NamedTensors& own_buffers() const { return buffers_; }

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();  // drops gradients (set_to_none, PyTorch's default)
  std::int64_t num_parameters() const;
  // Moves every parameter and buffer to `device` (module.to(device)): their storages move, so
  // views of them (a tied weight) follow, and each moves once.
  void move_to(Device& device);

 protected:
  // The blocks' forwards chained, each in this module's training mode: the forward of a model
  // made of blocks (GPT, ResNet), so that it and its block view compute alike.
  Tensor forward_blocks(const Tensor& x) const;
  Tensor& register_parameter(std::string name, Tensor value);
  Tensor& register_buffer(std::string name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    children_.emplace_back(std::move(name), module);
    return module;
  }

 private:
  void collect(const std::string& prefix, bool params, NamedTensors& out) const;

  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Layers applied in order. Slices share their modules, which is how a model is split into
// pipeline stages without copying weights.
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers);
  void push_back(std::shared_ptr<Module> layer);
  std::size_t size() const { return children().size(); }
  const std::shared_ptr<Module>& operator[](std::size_t i) const { return children()[i].second; }
  std::shared_ptr<Sequential> slice(std::size_t begin, std::size_t end) const;
  std::vector<std::shared_ptr<Module>> blocks() const override;

  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
};

// A model's blocks as a Sequential that shares them (the same modules and parameters): what
// recompute, offload and the pipeline cut and wrap. A Sequential is returned as it is; a module
// that presents no blocks is refused (std::invalid_argument naming its type).
std::shared_ptr<Sequential> as_sequential(const std::shared_ptr<Module>& model);

}  // namespace hpm::nn
