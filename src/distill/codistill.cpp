#include "hpm/distill/codistill.h"

#include <stdexcept>
#include <string>

#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/ops.h"
#include "hpm/distill/distiller.h"
#include "hpm/nn/losses.h"
#include "hpm/nn/objective.h"
#include "hpm/trace/trace.h"

namespace hpm::distill {

// ---- flattened state ----------------------------------------------------------------------------

Tensor flatten_state(const nn::Module& model) {
  std::int64_t total = 0;
  const nn::NamedTensors state = model.state_dict();
  for (const auto& [name, t] : state)
    if (t.dtype() == DType::F32) total += t.numel();
  Tensor flat = Tensor::empty({total});
  std::int64_t offset = 0;
  for (const auto& [name, t] : state) {
    if (t.dtype() != DType::F32) continue;
    flat.narrow(offset, t.numel()).copy_(t);
    offset += t.numel();
  }
  return flat;
}

void load_flat_state(nn::Module& model, const Tensor& flat) {
  std::int64_t offset = 0;
  const nn::NamedTensors state = model.state_dict();
  for (const auto& [name, t] : state) {
    if (t.dtype() != DType::F32) continue;
    if (offset + t.numel() > flat.numel()) {
      throw std::invalid_argument("load_flat_state: " + std::to_string(flat.numel()) +
                                  " values are too few for the model (at " + name + ")");
    }
    Tensor dst = t;  // shares the module's storage
    dst.copy_(flat.narrow(offset, t.numel()));
    offset += t.numel();
  }
  if (offset != flat.numel()) {
    throw std::invalid_argument("load_flat_state: " + std::to_string(flat.numel()) +
                                " values for a model of " + std::to_string(offset));
  }
}

// ---- codistiller --------------------------------------------------------------------------------

Codistiller::Codistiller(comm::CommunicatorPtr comm, std::shared_ptr<nn::Module> model,
                         const std::function<std::shared_ptr<nn::Module>()>& make_model,
                         CodistillOptions options)
    : comm_(std::move(comm)), model_(std::move(model)), options_(options) {
  if (!comm_ || !model_) throw std::invalid_argument("Codistiller: null communicator or model");
  if (options_.exchange_every < 1) {
    throw std::invalid_argument("codistillation: exchange_every must be >= 1, got " +
                                std::to_string(options_.exchange_every));
  }
  if (options_.burn_in < 0) throw std::invalid_argument("codistillation: burn_in must be >= 0");
  if (!(options_.alpha >= 0.0f && options_.alpha <= 1.0f)) {
    throw std::invalid_argument("codistillation: alpha must be in [0, 1], got " +
                                std::to_string(options_.alpha));
  }
  if (!(options_.temperature > 0.0f)) {
    throw std::invalid_argument("codistillation: temperature must be positive");
  }
  if (!exchanges_enabled()) return;
  if (!make_model) throw std::invalid_argument("Codistiller: no make_model for the peers");
  for (int r = 0; r < comm_->size(); ++r) {
    if (r == comm_->rank()) continue;
    auto peer = make_model();
    peer->eval();
    peers_.push_back(std::move(peer));
  }
}

void Codistiller::exchange(std::int64_t step) {
  if (!exchanges_enabled()) return;
  trace::Span span("codistill exchange", "distill");
  const Tensor mine = flatten_state(*model_);
  const std::int64_t p = mine.numel();
  Tensor all = Tensor::empty({p * comm_->size()});
  comm_->allgather(mine, all)->wait();
  std::size_t k = 0;
  for (int r = 0; r < comm_->size(); ++r) {
    if (r == comm_->rank()) continue;
    load_flat_state(*peers_[k++], all.narrow(r * p, p));
  }
  last_exchange_step_ = step;
  ++exchanges_;
}

Tensor Codistiller::peer_targets(const Tensor& inputs) const {
  if (last_exchange_step_ < 0) {
    throw std::logic_error("Codistiller: the peers' predictions needed before any exchange");
  }
  NoGradGuard no_grad;
  Tensor sum_p;
  for (const auto& peer : peers_) {
    peer->eval();
    Tensor p = softmax(mul(peer->forward(inputs), 1.0f / options_.temperature), -1);
    sum_p = sum_p.defined() ? add(sum_p, p) : p;
  }
  return mul(sum_p, 1.0f / static_cast<float>(peers_.size()));
}

Tensor Codistiller::loss(const Tensor& inputs, const Tensor& logits, const Tensor& labels,
                         std::int64_t step) const {
  // Before the burn-in ends (or without peers): exactly what independent training computes.
  if (!exchanges_enabled() || step < options_.burn_in) return cross_entropy(logits, labels);
  return soft_target_loss(logits, peer_targets(inputs), labels, options_.alpha,
                          options_.temperature);
}

// ---- trainer wiring -----------------------------------------------------------------------------

namespace {

class ExchangeCallback : public train::Callback {
 public:
  explicit ExchangeCallback(std::shared_ptr<Codistiller> c) : c_(std::move(c)) {}
  void on_train_begin(train::Trainer& t) override { c_->exchange(t.state().global_step); }
  void on_batch_end(train::Trainer&, const train::BatchLogs& b) override {
    if (b.global_step % c_->options().exchange_every == 0) c_->exchange(b.global_step);
  }

 private:
  std::shared_ptr<Codistiller> c_;
};

}  // namespace

CodistillObjective::CodistillObjective(std::shared_ptr<const nn::Objective> base,
                                       std::shared_ptr<const Codistiller> codistiller,
                                       std::function<std::int64_t()> step)
    : base_(std::move(base)), codistiller_(std::move(codistiller)), step_(std::move(step)) {
  if (!base_ || !codistiller_ || !step_) {
    throw std::invalid_argument("CodistillObjective: null objective, codistiller or step");
  }
}

nn::ObjectiveResult CodistillObjective::compute(const Tensor& outputs,
                                                const nn::Batch& batch) const {
  nn::ObjectiveResult r = base_->compute(outputs, batch);
  const Codistiller& c = *codistiller_;
  if (!c.exchanges_enabled() || !c.model().is_training() || step_() < c.options().burn_in) {
    return r;
  }
  r.loss = blend_with_soft_targets(r.loss, outputs, c.peer_targets(batch.inputs), c.options().alpha,
                                   c.options().temperature);
  return r;
}

void attach(train::Trainer& trainer, std::shared_ptr<Codistiller> codistiller,
            std::shared_ptr<const nn::Objective> base) {
  if (!base) base = std::make_shared<nn::Classification>();
  train::Trainer* t = &trainer;
  trainer.set_objective(std::make_shared<CodistillObjective>(
      std::move(base), codistiller, [t] { return t->state().global_step; }));
  if (codistiller->exchanges_enabled()) {
    trainer.add_callback(std::make_shared<ExchangeCallback>(std::move(codistiller)));
  }
}

namespace {

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

}  // namespace

double CopiesScore::mean_accuracy() const { return mean(accuracy); }
double CopiesScore::mean_loss() const { return mean(loss); }
double CopiesScore::mean_churn() const {
  std::vector<double> c;
  for (const Pair& p : pairs) c.push_back(p.churn.churn);
  return mean(c);
}

CopiesScore score_copies(const std::vector<Tensor>& logits, const Tensor& labels) {
  NoGradGuard no_grad;
  CopiesScore s;
  const auto rows = static_cast<double>(labels.numel());
  for (const Tensor& l : logits) {
    s.accuracy.push_back(rows > 0 ? static_cast<double>(nn::top1_correct(l, labels)) / rows : 0.0);
    s.loss.push_back(rows > 0 ? static_cast<double>(cross_entropy(l, labels).item()) : 0.0);
  }
  for (std::size_t a = 0; a < logits.size(); ++a) {
    for (std::size_t b = a + 1; b < logits.size(); ++b)
      s.pairs.push_back(
          {static_cast<int>(a), static_cast<int>(b), churn(logits[a], logits[b], labels)});
  }
  return s;
}

}  // namespace hpm::distill
