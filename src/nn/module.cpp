#include "hpm/nn/module.h"

#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "hpm/nn/fusion.h"
#include "hpm/tensor/kernels.h"

namespace hpm::nn {

Tensor& Module::register_parameter(std::string name, Tensor value) {
  if (value.defined()) value.set_requires_grad(true);
  params_.emplace_back(std::move(name), value);
  return params_.back().second;
}

Tensor& Module::register_buffer(std::string name, Tensor value) {
  buffers_.emplace_back(std::move(name), std::move(value));
  return buffers_.back().second;
}

void Module::collect(const std::string& prefix, bool params, NamedTensors& out) const {
  for (const auto& [name, t] : params ? params_ : buffers_)
    if (t.defined()) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", params, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors all, out;
  collect("", true, all);
  // A shared parameter (GPT's tied embedding and head) is one parameter: listed once, under the
  // first name it was reached by, as torch's named_parameters does, so optimizers update it once.
  std::set<const TensorImpl*> seen;
  for (auto& [name, t] : all)
    if (seen.insert(t.impl()).second) out.emplace_back(std::move(name), std::move(t));
  return out;
}

void Module::replace_parameter(const std::string& name, const Tensor& value) {
  for (auto& [n, t] : params_) {
    if (n != name) continue;
    if (t.defined() && value.defined() &&
        (t.shape() != value.shape() || t.dtype() != value.dtype())) {
      throw std::invalid_argument("replace_parameter: '" + name + "' is " + t.shape().str() +
                                  ", the replacement " + value.shape().str());
    }
    t = value;
    return;
  }
  throw std::invalid_argument("replace_parameter: " + type_name() + " has no parameter '" + name +
                              "'");
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

NamedTensors Module::state_dict() const {
  // Every name, shared parameters under each of theirs (as torch's state_dict), so a state dict
  // saved by PyTorch loads by name and one saved here loads there.
  NamedTensors out;
  collect("", true, out);
  for (auto& nb : named_buffers()) out.push_back(nb);
  return out;
}

void Module::load_state_dict(const NamedTensors& state) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) given[name] = &t;
  NamedTensors mine = state_dict();
  // Validate everything before changing anything.
  for (const auto& [name, t] : mine) {
    auto it = given.find(name);
    if (it == given.end())
      throw std::invalid_argument("load_state_dict: missing entry '" + name + "'");
    if (it->second->shape() != t.shape() || it->second->dtype() != t.dtype()) {
      throw std::invalid_argument("load_state_dict: '" + name + "' has shape " +
                                  it->second->shape().str() + " " +
                                  dtype_name(it->second->dtype()) + ", the model expects " +
                                  t.shape().str() + " " + dtype_name(t.dtype()));
    }
  }
  if (given.size() != mine.size()) {
    std::map<std::string, bool> known;
    for (const auto& [name, t] : mine) known[name] = true;
    for (const auto& [name, t] : given)
      if (!known.count(name)) {
        throw std::invalid_argument("load_state_dict: unexpected entry '" + name + "'");
      }
  }
  for (auto& [name, t] : mine) t.copy_(*given[name]);
}

Module::LoadReport Module::load_weights(const NamedTensors& state, bool strict) {
  LoadReport report;
  NamedTensors mine = state_dict();
  std::map<std::string, Tensor> expected;
  for (const auto& [name, t] : mine) expected[name] = t;
  NamedTensors cast;
  for (const auto& [name, t] : state) {
    const auto it = expected.find(name);
    const bool widen =
        it != expected.end() && it->second.dtype() == DType::F32 &&
        (t.dtype() == DType::F16 || t.dtype() == DType::BF16 || t.dtype() == DType::F64);
    if (widen) ++report.cast;
    cast.emplace_back(name, widen ? kernels::to_f32(t) : t);
  }
  if (strict) {
    load_state_dict(cast);
    report.loaded = mine.size();
    return report;
  }
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : cast) given[name] = &t;
  NamedTensors present;
  for (const auto& [name, t] : mine) {
    const auto it = given.find(name);
    if (it == given.end()) {
      report.missing.push_back(name);
      continue;
    }
    if (it->second->shape() != t.shape() || it->second->dtype() != t.dtype()) {
      throw std::invalid_argument("load_weights: '" + name + "' has shape " +
                                  it->second->shape().str() + " " +
                                  dtype_name(it->second->dtype()) + ", the model expects " +
                                  t.shape().str() + " " + dtype_name(t.dtype()));
    }
    present.emplace_back(name, *it->second);
  }
  for (const auto& [name, t] : cast)
    if (!expected.count(name)) report.unexpected.push_back(name);
  std::map<std::string, Tensor> values(present.begin(), present.end());
  for (auto& [name, t] : mine) {
    const auto it = values.find(name);
    if (it != values.end()) t.copy_(it->second);
  }
  report.loaded = present.size();
  return report;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (auto& t : parameters())
    if (t.impl()->autograd) t.impl()->autograd->grad.reset();
}

void Module::move_to(Device& device) {
  for (const auto& [name, t] : state_dict()) t.impl()->storage->move_to(device);
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& t : parameters()) n += t.numel();
  return n;
}

std::string Module::repr(int indent) const {
  std::ostringstream os;
  os << type_name() << '(' << extra_repr();
  if (!children_.empty()) {
    os << '\n';
    for (const auto& [name, child] : children_)
      os << std::string(static_cast<std::size_t>(indent + 2), ' ') << '(' << name
         << "): " << child->repr(indent + 2) << '\n';
    os << std::string(static_cast<std::size_t>(indent), ' ');
  }
  os << ')';
  return os.str();
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> layers) {
  for (auto& l : layers) push_back(std::move(l));
}

void Sequential::push_back(std::shared_ptr<Module> layer) {
  register_module(std::to_string(size()), std::move(layer));
}

std::shared_ptr<Sequential> as_sequential(const std::shared_ptr<Module>& model) {
  if (auto s = std::dynamic_pointer_cast<Sequential>(model)) return s;
  std::vector<std::shared_ptr<Module>> blocks = model->blocks();
  if (blocks.empty()) {
    throw std::invalid_argument(model->type_name() +
                                " presents no blocks: it cannot be cut into stages or segments");
  }
  auto s = std::make_shared<Sequential>(std::move(blocks));
  s->train(model->is_training());
  return s;
}

Tensor Module::forward_inputs(const std::vector<Tensor>& inputs) {
  if (inputs.size() != 1) {
    throw std::invalid_argument(type_name() + " takes one input, got " +
                                std::to_string(inputs.size()));
  }
  return forward(inputs[0]);
}

namespace {
bool whole_module_in_mode(const Module& m, bool training) {
  if (m.is_training() != training) return false;
  for (const auto& [name, child] : m.children())
    if (!whole_module_in_mode(*child, training)) return false;
  return true;
}
}  // namespace

Tensor Module::forward_blocks(const Tensor& x) const {
  Tensor h = x;
  for (const auto& b : blocks()) {
    // Written only when it differs: forwards of one model on several threads at once (a teacher
    // shared by a strategy's replicas) then only read the flags.
    if (!whole_module_in_mode(*b, training_)) b->train(training_);
    h = b->forward(h);
  }
  return h;
}

std::vector<std::shared_ptr<Module>> Sequential::blocks() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, m] : children()) out.push_back(m);
  return out;
}

std::shared_ptr<Sequential> Sequential::slice(std::size_t begin, std::size_t end) const {
  if (begin > end || end > size()) {
    throw std::out_of_range("Sequential::slice(" + std::to_string(begin) + ", " +
                            std::to_string(end) + ") of " + std::to_string(size()) + " layers");
  }
  auto s = std::make_shared<Sequential>();
  for (std::size_t i = begin; i < end; ++i) s->push_back((*this)[i]);
  return s;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  const std::vector<std::shared_ptr<Module>> layers = blocks();
  for (const Unit& u : plan_units(layers)) h = u.fused ? u.fused(h) : layers[u.begin]->forward(h);
  return h;
}

}  // namespace hpm::nn
