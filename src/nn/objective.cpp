#include "hpm/nn/objective.h"

#include <cmath>
#include <stdexcept>

#include "hpm/autograd/grad_mode.h"
#include "hpm/tensor/kernels.h"

namespace hpm::nn {

// ---- metrics ----------------------------------------------------------------------------------

Metrics::Metrics(const std::vector<std::string>& names) {
  for (const auto& n : names) entries_.push_back({n, 0.0, 0.0});
}

void Metrics::add(const std::string& name, double sum, double count) {
  for (auto& e : entries_) {
    if (e.name == name) {
      e.sum += sum;
      e.count += count;
      return;
    }
  }
  entries_.push_back({name, sum, count});
}

void Metrics::merge(const Metrics& other) {
  for (const auto& e : other.entries_) add(e.name, e.sum, e.count);
}

bool Metrics::has(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return true;
  return false;
}

double Metrics::mean(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e.mean();
  return 0.0;
}

double Metrics::sum(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e.sum;
  return 0.0;
}

double Metrics::count(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e.count;
  return 0.0;
}

std::pair<std::int64_t, std::int64_t> top1_hits(const Tensor& logits, const Tensor& labels,
                                                std::int64_t ignore_index) {
  const Tensor pred = kernels::argmax_last(logits);
  if (pred.numel() != labels.numel() || labels.dtype() != DType::I64) {
    throw std::invalid_argument("top1_hits: " + logits.shape().str() + " logits against " +
                                labels.shape().str() + " labels");
  }
  const std::vector<std::int64_t> p = pred.to_vector_i64(), y = labels.to_vector_i64();
  std::int64_t hits = 0, counted = 0;
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    if (y[i] == ignore_index) continue;
    ++counted;
    hits += p[i] == y[i];
  }
  return {hits, counted};
}

namespace {

// "loss" as a sum over `units`: the mean times their number.
void add_loss(Metrics& m, const Tensor& loss, double units) {
  m.add("loss", static_cast<double>(loss.item()) * units, units);
}

}  // namespace

// ---- built-in objectives ----------------------------------------------------------------------

ObjectiveResult Classification::compute(const Tensor& outputs, const Batch& batch) const {
  ObjectiveResult r;
  r.loss = cross_entropy(outputs, batch.targets, smoothing_);
  const auto rows = static_cast<double>(batch.rows());
  add_loss(r.metrics, r.loss, rows);
  r.metrics.add("accuracy", static_cast<double>(top1_hits(outputs, batch.targets).first), rows);
  return r;
}

LanguageModelling::LanguageModelling(std::int64_t ignore_index, float label_smoothing)
    : ignore_(ignore_index), smoothing_(label_smoothing) {
  if (smoothing_ != 0.0f) plain_ = std::make_shared<LanguageModelling>(ignore_index);
}

ObjectiveResult LanguageModelling::compute(const Tensor& outputs, const Batch& batch) const {
  if (outputs.dim() != 3 || batch.targets.dim() != 2) {
    throw std::invalid_argument(
        "language modelling: expected logits (B, T, V) and targets (B, T), got " +
        outputs.shape().str() + " and " + batch.targets.shape().str());
  }
  ObjectiveResult r;
  r.loss = cross_entropy(outputs, batch.targets, smoothing_, ignore_);
  const auto [hits, tokens] = top1_hits(outputs, batch.targets, ignore_);
  add_loss(r.metrics, r.loss, static_cast<double>(tokens));
  r.metrics.add("token_accuracy", static_cast<double>(hits), static_cast<double>(tokens));
  return r;
}

double LanguageModelling::weight(const Batch& batch) const {
  const std::vector<std::int64_t> y = batch.targets.to_vector_i64();
  const auto n = std::count_if(y.begin(), y.end(), [&](std::int64_t v) { return v != ignore_; });
  return static_cast<double>(n);
}

void LanguageModelling::derive(Metrics& m) const {
  if (m.count("loss") > 0) m.add("perplexity", std::exp(m.mean("loss")), 1.0);
}

ObjectiveResult SoftTargets::compute(const Tensor& outputs, const Batch& batch) const {
  check_shape(batch.targets, outputs.shape(), "soft targets");
  ObjectiveResult r;
  // -sum_c p log q, row mean: the KL to the targets plus their (constant) entropy.
  r.loss = mul(mean(sum(mul(batch.targets, log_softmax(outputs, -1)), -1)), -1.0f);
  const auto rows = static_cast<double>(batch.rows());
  add_loss(r.metrics, r.loss, rows);
  r.metrics.add("accuracy",
                static_cast<double>(top1_hits(outputs, kernels::argmax_last(batch.targets)).first),
                rows);
  return r;
}

FunctionObjective::FunctionObjective(LossFunction loss, std::string name)
    : loss_(std::move(loss)), name_(std::move(name)) {
  if (!loss_) throw std::invalid_argument("FunctionObjective: no loss function");
}

std::vector<std::string> FunctionObjective::metric_names(const Batch& batch) const {
  if (batch.targets.defined() && batch.targets.dtype() == DType::I64) return {"loss", "accuracy"};
  return {"loss"};
}

ObjectiveResult FunctionObjective::compute(const Tensor& outputs, const Batch& batch) const {
  ObjectiveResult r;
  r.loss = loss_(outputs, batch.inputs, batch.targets);
  const auto rows = static_cast<double>(batch.rows());
  add_loss(r.metrics, r.loss, rows);
  if (batch.targets.dtype() == DType::I64) {
    r.metrics.add("accuracy", static_cast<double>(top1_hits(outputs, batch.targets).first), rows);
  }
  return r;
}

}  // namespace hpm::nn
