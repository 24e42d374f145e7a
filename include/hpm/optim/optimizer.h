// Optimizers as in torch.optim, each a single fused pass per parameter. State is named after the
// parameters ("0.weight.momentum_buffer"), so it saves to safetensors beside the model and can be
// sharded by name later.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpm/nn/module.h"
#include "hpm/tensor/op_params.h"

namespace hpm::optim {

using nn::NamedTensors;

class Optimizer {
 public:
  Optimizer(NamedTensors params, float lr);
  virtual ~Optimizer() = default;

  // Applies one update from the parameters' .grad (parameters without a gradient are skipped).
  void step() { clip_and_step(0.0f); }
  // step() after clip_grad_norm(max_norm) over those gradients (0: no clipping). Adam and AdamW do
  // both in a few fused kernels (adam_step_multi_) that read the norm where it was computed, so a
  // GPU's step waits for nothing on the host.
  //
  // A norm that is not finite (NaN or Inf gradients under a finite loss: sqrt's backward at 0, an
  // overflow) skips the update: nothing changes, and every later clip_and_step skips too, until
  // resume_updates(). Without clipping no norm is computed and such gradients are applied, as
  // torch.optim applies them.
  void clip_and_step(float max_norm);
  // Whether an update was skipped for a norm that was not finite (see clip_and_step): the
  // parameters and state are then as they were before that step (the step count aside: skipped
  // steps on a device count, so resume after load_state, which sets it). Adam's fused update keeps
  // the verdict on the device, so reading it waits for the device's work issued so far (a GPU's
  // step reads it when it next waits anyway). step_params skips too.
  bool updates_halted() const;
  // The same verdict from a caller that clips by a norm of its own (a pipeline's, over every
  // stage) and found it not finite.
  void halt_updates() { halted_on_host_ = true; }
  void resume_updates();
  // Gates the next clip_and_step on `loss` (a one-element F32 tensor beside the parameters, not
  // read here), for a caller that issues the update before it reads the loss. Where the update is
  // gated on the device (gates_on_device()), it is skipped there, as for a non-finite norm, unless
  // the loss is finite and (on a GPU) every index check issued so far passed; elsewhere the loss is
  // read now and a non-finite one halts on the host. A caller that then finds the loss not finite
  // takes the skipped update back with retract_skipped_step().
  void gate_on(const Tensor& loss);
  // Whether clip_and_step keeps its verdict on the device (Adam's fused update, its parameters on
  // one device): gate_on costs no wait there.
  virtual bool gates_on_device() const { return false; }
  // The device's verdict (an I32 scalar, 1 once an update was skipped), undefined until a gate or
  // clipping made it: a caller may read it with its own reads instead of updates_halted()'s wait.
  const Tensor& halted_flag() const { return halted_on_device_; }
  // After a gated clip_and_step that the caller knows was skipped: clears the halt and takes the
  // step's count back, so that the optimizer is as it was before that clip_and_step.
  void retract_skipped_step();
  // step() in parts, for callers that update disjoint sets of parameters from several threads at
  // once (pipeline stages, each on its own): begin_step() once, then step_params() per part,
  // the parts together naming each parameter once. Indices are into params().
  void begin_step();
  void step_params(const std::vector<std::size_t>& indices);
  void zero_grad();
  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  std::int64_t steps() const { return steps_; }

  // Everything needed to continue bit-exactly: per-parameter buffers and the step count.
  NamedTensors state() const;
  // Throws std::invalid_argument naming a missing or mis-shaped entry.
  void load_state(const NamedTensors& state);
  const NamedTensors& params() const { return params_; }
  virtual std::string name() const = 0;

  // The buffers update() keeps for parameter i, by name: what state() holds for it once it was
  // updated. With find_buffer (undefined until the first update makes it) and make_buffer, state
  // moves between copies of one optimizer that updated different parameters (pipeline stages in
  // separate processes).
  virtual std::vector<std::string> buffer_names(std::size_t i) const = 0;
  Tensor find_buffer(std::size_t i, const std::string& name) const;
  Tensor make_buffer(std::size_t i, const std::string& name);

 protected:
  // Updates parameter i (p) from its gradient g, by tensor ops (on p's device).
  virtual void update(std::size_t i, Tensor& p, const Tensor& g) = 0;
  // Updates every parameter that has a gradient, after clipping (max_norm > 0): by default
  // clip_grad_norm, then update() one parameter at a time.
  virtual void update_all(float max_norm);
  // Buffer `name` of parameter i, zero-initialized on first use (on p's device).
  Tensor buffer(std::size_t i, const std::string& name);
  bool has_buffer(std::size_t i, const std::string& name) const;

  NamedTensors params_;
  float lr_;
  std::int64_t steps_ = 0;
  // The verdict of updates_halted(): the host's, or (Adam's fused update) an I32 flag beside the
  // parameters that adam_step_multi_ sets, made on first use.
  bool halted_on_host_ = false;
  Tensor halted_on_device_;
  bool last_step_counted_ = false;  // the last clip_and_step counted a step (retract_skipped_step)

 private:
  void update_one(std::size_t i);
  std::vector<std::vector<std::pair<std::string, Tensor>>> buffers_;  // per parameter
};

struct SgdOptions {
  float lr = 0.01f, momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
  int weight_decay_min_rank = 0;  // as AdamOptions'
};

class SGD : public Optimizer {
 public:
  SGD(NamedTensors params, const SgdOptions& o);
  std::string name() const override { return "SGD"; }
  std::vector<std::string> buffer_names(std::size_t i) const override;

 protected:
  void update(std::size_t i, Tensor& p, const Tensor& g) override;

 private:
  SgdOptions o_;
};

struct AdamOptions {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool amsgrad = false;
  bool decoupled_weight_decay = false;  // AdamW
  // Weight decay applies only to parameters of at least this many dimensions: 2 decays the
  // weights of Linears and Embeddings but not biases or norms (nanoGPT's two parameter groups).
  // 0: every parameter.
  int weight_decay_min_rank = 0;
};

class Adam : public Optimizer {
 public:
  Adam(NamedTensors params, const AdamOptions& o);
  std::string name() const override { return o_.decoupled_weight_decay ? "AdamW" : "Adam"; }
  std::vector<std::string> buffer_names(std::size_t i) const override;
  bool gates_on_device() const override;

 protected:
  void update(std::size_t i, Tensor& p, const Tensor& g) override;
  // Parameters grouped by device and weight decay, one adam_step_multi_ per group.
  void update_all(float max_norm) override;

 private:
  kernels::AdamStep step_for(std::size_t i) const;
  AdamOptions o_;
};

class AdamW : public Adam {
 public:
  AdamW(NamedTensors params, AdamOptions o) : Adam(std::move(params), with_decoupled(o)) {}

 private:
  static AdamOptions with_decoupled(AdamOptions o) {
    o.decoupled_weight_decay = true;
    return o;
  }
};

// Scales all gradients so their global L2 norm is at most max_norm; returns the norm before
// clipping (torch.nn.utils.clip_grad_norm_).
float clip_grad_norm(const std::vector<Tensor>& params, float max_norm);
// Its scaling, for a squared norm computed elsewhere (a pipeline's, over every stage): each
// gradient of params times max_norm / (norm + 1e-6) when that is below 1. Returns the norm.
float clip_grads_to(const std::vector<Tensor>& params, double norm_sq, float max_norm);

}  // namespace hpm::optim
