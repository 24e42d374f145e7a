#include "hpm/nn/recompute.h"

#include <stdexcept>

#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/node.h"
#include "hpm/nn/fusion.h"
#include "hpm/tensor/random.h"
#include "hpm/trace/trace.h"

namespace hpm::nn {

namespace {

thread_local bool recomputing_now = false;

class RecomputingGuard {
 public:
  RecomputingGuard() : previous_(recomputing_now) { recomputing_now = true; }
  ~RecomputingGuard() { recomputing_now = previous_; }
  RecomputingGuard(const RecomputingGuard&) = delete;
  RecomputingGuard& operator=(const RecomputingGuard&) = delete;

 private:
  bool previous_;
};

class GradModeGuard {
 public:
  explicit GradModeGuard(bool on) : previous_(autograd::grad_enabled()) {
    autograd::set_grad_enabled(on);
  }
  ~GradModeGuard() { autograd::set_grad_enabled(previous_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// Segments of `every` units, each run through forward_recomputed() unless the mode spares it.
class RecomputedSequential final : public Sequential {
 public:
  RecomputedSequential(const Sequential& model, int every, RecomputeMode mode)
      : mode_(mode), every_(every) {
    for (std::size_t i = 0; i < model.size(); ++i) push_back(model[i]);
    const auto units = sequential_units(model);
    for (std::size_t u = 0; u < units.size(); u += static_cast<std::size_t>(every)) {
      const std::size_t last = std::min(units.size(), u + static_cast<std::size_t>(every)) - 1;
      segments_.push_back(model.slice(units[u].first, units[last].second));
    }
  }

  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (std::size_t s = 0; s < segments_.size(); ++s) {
      const bool last = s + 1 == segments_.size();
      const bool recompute =
          mode_ == RecomputeMode::Always || (mode_ == RecomputeMode::ExceptLast && !last);
      h = recompute ? forward_recomputed(*segments_[s], h) : segments_[s]->forward(h);
    }
    return h;
  }

  std::string extra_repr() const override {
    return "recompute=" + to_string(mode_) + ", every=" + std::to_string(every_);
  }

 private:
  RecomputeMode mode_;
  int every_;
  std::vector<std::shared_ptr<Sequential>> segments_;
};

}  // namespace

RecomputeMode parse_recompute_mode(const std::string& text) {
  if (text == "never") return RecomputeMode::Never;
  if (text == "always") return RecomputeMode::Always;
  if (text == "except_last") return RecomputeMode::ExceptLast;
  throw std::invalid_argument("recompute mode \"" + text +
                              "\" is not one of never, always, except_last");
}

std::string to_string(RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::Never:
      return "never";
    case RecomputeMode::Always:
      return "always";
    case RecomputeMode::ExceptLast:
      return "except_last";
  }
  return "?";
}

bool recomputing() { return recomputing_now; }

Tensor forward_recomputed(Module& module, const Tensor& x) {
  if (!autograd::grad_enabled()) return module.forward(x);
  // The generator dropout will draw from, and where it stands: the re-run starts from there.
  Generator* gen = &default_generator();
  const Generator::State rng = gen->state();
  Tensor y;
  {
    NoGradGuard no_grad;  // nothing inside is recorded, so nothing inside is kept
    y = module.forward(x);
  }
  autograd::Tensors inputs{x};
  for (const Tensor& p : module.parameters()) inputs.push_back(p);
  Module* m = &module;
  // Parameters are inputs only so that the node exists and orders backward correctly; their
  // gradients reach the leaves through the re-run's own backward, so this node returns none.
  return autograd::record("Checkpoint", inputs, y,
                          [m, x, gen, rng](const Tensor& grad, const std::vector<bool>& needs) {
                            trace::Span span("recompute", "compute");
                            Tensor input = x.detach();
                            if (needs[0]) input.set_requires_grad(true);
                            Tensor again;
                            {
                              const Generator::State now = gen->state();
                              gen->set_state(rng);
                              GradModeGuard grad_on(true);
                              RecomputingGuard flag;
                              again = m->forward(input);
                              gen->set_state(now);
                            }
                            autograd::Tensors grads(needs.size());
                            if (again.requires_grad()) {
                              again.backward(grad);
                              if (needs[0]) grads[0] = input.grad();
                            }
                            return grads;
                          });
}

std::vector<std::pair<std::size_t, std::size_t>> sequential_units(const Sequential& model) {
  std::vector<std::pair<std::size_t, std::size_t>> units;
  for (const Unit& u : plan_units(model.blocks())) units.emplace_back(u.begin, u.end);
  return units;
}

std::shared_ptr<Module> with_recomputation(std::shared_ptr<Sequential> model, int every,
                                           RecomputeMode mode) {
  if (!model) throw std::invalid_argument("with_recomputation: no model");
  if (every < 1) {
    throw std::invalid_argument("with_recomputation: every must be at least 1 layer, got " +
                                std::to_string(every));
  }
  return std::make_shared<RecomputedSequential>(*model, every, mode);
}

}  // namespace hpm::nn
