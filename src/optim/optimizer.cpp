#include "hpm/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <stdexcept>

#include "hpm/tensor/kernels.h"
#include "hpm/tensor/placement.h"

namespace hpm::optim {

Optimizer::Optimizer(NamedTensors params, float lr)
    : params_(std::move(params)), lr_(lr), buffers_(params_.size()) {
  if (!(lr >= 0.0f))
    throw std::invalid_argument("learning rate must be >= 0, got " + std::to_string(lr));
  for (auto& [name, p] : params_) {
    if (!p.requires_grad()) {
      throw std::invalid_argument("optimizer parameter '" + name + "' does not require grad");
    }
  }
}

void Optimizer::clip_and_step(float max_norm) {
  last_step_counted_ = false;
  if (halted_on_host_) return;  // not even counted (a halt on the device is, unseen here)
  begin_step();
  last_step_counted_ = true;
  update_all(max_norm);
}

void Optimizer::gate_on(const Tensor& loss) {
  if (!gates_on_device()) {
    if (!std::isfinite(loss.item())) halted_on_host_ = true;
    return;
  }
  if (!halted_on_device_.defined()) {
    halted_on_device_ = Tensor::zeros(Shape{}, DType::I32, device_beside(params_.front().second));
  }
  kernels::halt_unless_finite_(halted_on_device_, loss);
}

void Optimizer::retract_skipped_step() {
  if (last_step_counted_) --steps_;
  last_step_counted_ = false;
  resume_updates();
}

namespace {

// clip_grad_norm in two halves, so that a caller can look at the norm before anything is scaled.
std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

float scale_to_norm(const std::vector<Tensor>& grads, double norm_sq, float max_norm) {
  const auto norm = static_cast<float>(std::sqrt(norm_sq));
  const float coef = max_norm / (norm + 1e-6f);
  if (coef < 1.0f) {
    for (Tensor g : grads) kernels::scale_(g, coef);
  }
  return norm;
}

}  // namespace

void Optimizer::update_all(float max_norm) {
  if (halted_on_host_) return;
  if (max_norm > 0.0f) {
    std::vector<Tensor> params;
    for (const auto& [name, p] : params_) params.push_back(p);
    const std::vector<Tensor> grads = grads_of(params);
    const double norm_sq = kernels::squared_norm(grads).item<double>();
    if (!std::isfinite(norm_sq)) {
      halted_on_host_ = true;
      return;
    }
    scale_to_norm(grads, norm_sq, max_norm);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) update_one(i);
}

bool Optimizer::updates_halted() const {
  return halted_on_host_ || (halted_on_device_.defined() && halted_on_device_.item() != 0.0f);
}

void Optimizer::resume_updates() {
  halted_on_host_ = false;
  if (halted_on_device_.defined()) halted_on_device_ = Tensor();
}

void Optimizer::begin_step() { ++steps_; }

void Optimizer::step_params(const std::vector<std::size_t>& indices) {
  if (halted_on_host_) return;
  for (std::size_t i : indices) {
    if (i >= params_.size()) {
      throw std::out_of_range("optimizer: parameter index " + std::to_string(i) + " of " +
                              std::to_string(params_.size()));
    }
    update_one(i);
  }
}

void Optimizer::update_one(std::size_t i) {
  Tensor g = params_[i].second.grad();
  if (!g.defined()) return;
  update(i, params_[i].second, g);
}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_)
    if (p.impl()->autograd) p.impl()->autograd->grad.reset();
}

Tensor Optimizer::buffer(std::size_t i, const std::string& name) {
  for (auto& [n, t] : buffers_[i])
    if (n == name) return t;
  const Tensor& p = params_[i].second;
  buffers_[i].emplace_back(name, Tensor::zeros(p.shape(), DType::F32, device_beside(p)));
  return buffers_[i].back().second;
}

bool Optimizer::has_buffer(std::size_t i, const std::string& name) const {
  return find_buffer(i, name).defined();
}

Tensor Optimizer::find_buffer(std::size_t i, const std::string& name) const {
  for (const auto& [n, t] : buffers_.at(i))
    if (n == name) return t;
  return {};
}

Tensor Optimizer::make_buffer(std::size_t i, const std::string& name) {
  if (Tensor t = find_buffer(i, name); t.defined()) return t;
  buffer(i, name);
  return buffers_[i].back().second;
}

NamedTensors Optimizer::state() const {
  NamedTensors out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (auto& [n, t] : buffers_[i]) out.emplace_back(params_[i].first + "." + n, t);
  out.emplace_back("step", Tensor::from_i64(std::vector<std::int64_t>{steps_}, Shape{}));
  return out;
}

void Optimizer::load_state(const NamedTensors& state) {
  std::vector<std::vector<std::pair<std::string, Tensor>>> loaded(params_.size());
  std::int64_t steps = -1;
  for (const auto& [key, t] : state) {
    if (key == "step") {
      steps = static_cast<std::int64_t>(t.item());
      continue;
    }
    bool matched = false;
    for (std::size_t i = 0; i < params_.size() && !matched; ++i) {
      const std::string& pname = params_[i].first;
      if (key.size() > pname.size() + 1 && key.compare(0, pname.size(), pname) == 0 &&
          key[pname.size()] == '.' && key.find('.', pname.size() + 1) == std::string::npos) {
        check_shape(t, params_[i].second.shape(), ("optimizer state '" + key + "'").c_str());
        // A copy beside its parameter: state saved from a GPU's run may resume on the CPU, and
        // the other way.
        Tensor copy = Tensor::empty(t.shape(), t.dtype(), device_beside(params_[i].second));
        copy.copy_(t);
        loaded[i].emplace_back(key.substr(pname.size() + 1), copy);
        matched = true;
      }
    }
    if (!matched) {
      throw std::invalid_argument("optimizer state '" + key + "' matches no parameter of " +
                                  name());
    }
  }
  if (steps < 0) throw std::invalid_argument("optimizer state has no 'step' entry");
  // A parameter's state is whole and this optimizer's, or absent (never updated): another
  // optimizer's (SGD's momentum into Adam) would load as unused buffers beside fresh moments.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (loaded[i].empty()) continue;
    const std::vector<std::string> names = buffer_names(i);
    for (const auto& [buffer, t] : loaded[i]) {
      if (std::find(names.begin(), names.end(), buffer) == names.end()) {
        throw std::invalid_argument("optimizer state '" + params_[i].first + "." + buffer +
                                    "' is not " + name() +
                                    "'s (saved by another optimizer, or other options?)");
      }
    }
    for (const std::string& buffer : names) {
      const bool found = std::any_of(loaded[i].begin(), loaded[i].end(),
                                     [&](const auto& e) { return e.first == buffer; });
      if (!found) {
        throw std::invalid_argument("optimizer state has no '" + params_[i].first + "." + buffer +
                                    "', which " + name() + " keeps (saved by another optimizer?)");
      }
    }
  }
  buffers_ = std::move(loaded);
  steps_ = steps;
  resume_updates();  // the state of a step that was applied
}

SGD::SGD(NamedTensors params, const SgdOptions& o) : Optimizer(std::move(params), o.lr), o_(o) {
  if (o.momentum < 0.0f) throw std::invalid_argument("SGD: momentum must be >= 0");
  if (o.nesterov && (o.momentum <= 0.0f || o.dampening != 0.0f)) {
    throw std::invalid_argument("SGD: nesterov needs momentum > 0 and dampening 0");
  }
}

std::vector<std::string> SGD::buffer_names(std::size_t) const {
  if (o_.momentum == 0.0f) return {};
  return {"momentum_buffer"};
}

void SGD::update(std::size_t i, Tensor& p, const Tensor& g) {
  const float mom = o_.momentum;
  const bool first = mom != 0.0f && !has_buffer(i, "momentum_buffer");
  Tensor buf = mom != 0.0f ? buffer(i, "momentum_buffer") : Tensor();
  // torch: the first step seeds the buffer with the gradient itself (no dampening).
  const float wd = p.dim() >= o_.weight_decay_min_rank ? o_.weight_decay : 0.0f;
  const kernels::SgdStep s{
      lr_, wd, mom, first ? 0.0f : mom, first ? 1.0f : 1.0f - o_.dampening, o_.nesterov};
  kernels::sgd_step_(s, p, g, buf);
}

Adam::Adam(NamedTensors params, const AdamOptions& o) : Optimizer(std::move(params), o.lr), o_(o) {
  if (o.beta1 < 0.0f || o.beta1 >= 1.0f || o.beta2 < 0.0f || o.beta2 >= 1.0f) {
    throw std::invalid_argument("Adam: betas must be in [0, 1)");
  }
}

std::vector<std::string> Adam::buffer_names(std::size_t) const {
  if (o_.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

kernels::AdamStep Adam::step_for(std::size_t i) const {
  const auto t = static_cast<double>(steps_);
  const float b1 = o_.beta1, b2 = o_.beta2, eps = o_.eps, lr = lr_;
  const float wd = params_[i].second.dim() >= o_.weight_decay_min_rank ? o_.weight_decay : 0.0f;
  const auto bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
  const auto bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  const float step_size = lr / bias1;
  const bool decoupled = o_.decoupled_weight_decay;
  return kernels::AdamStep{
      b1, b2, eps, decoupled ? 1.0f - lr * wd : 1.0f, decoupled ? 0.0f : wd, step_size, bias2_sqrt};
}

void Adam::update(std::size_t i, Tensor& p, const Tensor& g) {
  Tensor m = buffer(i, "exp_avg");
  Tensor v = buffer(i, "exp_avg_sq");
  Tensor vmax = o_.amsgrad ? buffer(i, "max_exp_avg_sq") : Tensor();
  kernels::adam_step_(step_for(i), p, g, m, v, vmax);
}

bool Adam::gates_on_device() const {
  if (params_.empty()) return false;
  const DeviceId first = params_.front().second.device().id();
  return std::all_of(params_.begin(), params_.end(),
                     [&](const auto& p) { return p.second.device().id() == first; });
}

void Adam::update_all(float max_norm) {
  struct Group {
    const Device* device;
    kernels::AdamStep step;
    std::vector<Tensor> p, g, m, v, vmax;
  };
  std::vector<Group> groups;
  std::vector<Tensor> grads;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].second;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    const kernels::AdamStep s = step_for(i);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& gr) {
      return gr.device == &p.device() && gr.step.decay == s.decay && gr.step.l2 == s.l2;
    });
    if (it == groups.end()) {
      groups.push_back(Group{&p.device(), s, {}, {}, {}, {}, {}});
      it = std::prev(groups.end());
    }
    it->p.push_back(p);
    it->g.push_back(g);
    it->m.push_back(buffer(i, "exp_avg"));
    it->v.push_back(buffer(i, "exp_avg_sq"));
    if (o_.amsgrad) it->vmax.push_back(buffer(i, "max_exp_avg_sq"));
    grads.push_back(g);
  }
  if (groups.empty()) return;
  // One norm over every gradient (clip_grad_norm's), left where the gradients are; gradients on
  // several devices take the per-parameter path.
  const bool one_device = std::all_of(groups.begin(), groups.end(), [&](const Group& gr) {
    return gr.device->id() == groups[0].device->id();
  });
  if (max_norm > 0.0f && !one_device) {
    Optimizer::update_all(max_norm);
    return;
  }
  if (halted_on_host_) return;
  const Tensor norm_sq = max_norm > 0.0f ? kernels::squared_norm(grads) : Tensor();
  // The norm's verdict stays on the device with it (adam_step_multi_'s gate): a GPU's step does
  // not wait for its gradients before issuing the update.
  if (norm_sq.defined() && !halted_on_device_.defined()) {
    halted_on_device_ = Tensor::zeros(Shape{}, DType::I32, device_beside(groups[0].p[0]));
  }
  for (Group& gr : groups) {
    kernels::adam_step_multi_(gr.step, gr.p, gr.g, gr.m, gr.v, gr.vmax, norm_sq, max_norm,
                              halted_on_device_);
  }
}

float clip_grad_norm(const std::vector<Tensor>& params, float max_norm) {
  const std::vector<Tensor> grads = grads_of(params);
  return scale_to_norm(grads, kernels::squared_norm(grads).item<double>(), max_norm);
}

float clip_grads_to(const std::vector<Tensor>& params, double norm_sq, float max_norm) {
  return scale_to_norm(grads_of(params), norm_sq, max_norm);
}

}  // namespace hpm::optim
