#include "hpm/nn/objective.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
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

void Metrics::add_pending(const std::string& name, const Pending& pending) {
  add(name, 0.0, 0.0);  // its place, in order
  Pending p = pending;
  // Values only: a loss's autograd graph (every saved activation) must not live on here.
  p.sum_of = p.sum_of.detach();
  if (p.count_of.defined()) p.count_of = p.count_of.detach();
  pending_.emplace_back(name, std::move(p));
}

void Metrics::merge(const Metrics& other) {
  for (const auto& e : other.entries_) add(e.name, e.sum, e.count);
  pending_.insert(pending_.end(), other.pending_.begin(), other.pending_.end());
}

std::shared_ptr<HostRead> Metrics::begin_read(const std::vector<Tensor>& with) {
  std::vector<Tensor> values = with;
  const auto place = [&](const Tensor& t) {
    for (std::size_t i = 0; i < values.size(); ++i)
      if (values[i].impl() == t.impl()) return i;
    values.push_back(t);
    return values.size() - 1;
  };
  std::vector<Pending*> reading;
  for (auto& [name, p] : pending_) {
    if (p.read) continue;
    p.sum_read = place(p.sum_of);
    if (p.count_of.defined()) p.count_read = place(p.count_of);
    reading.push_back(&p);
  }
  if (values.empty()) return nullptr;
  auto read = std::make_shared<HostRead>(values);
  for (Pending* p : reading) p->read = read;
  return read;
}

void Metrics::settle() const {
  if (pending_.empty()) return;
  // Each distinct tensor read once: the first read waits for the device, the rest are copies.
  std::vector<std::pair<const void*, std::vector<double>>> read;
  const auto value = [&](const Tensor& t, std::int64_t at) {
    const void* key = t.impl();
    auto it = std::find_if(read.begin(), read.end(), [&](const auto& r) { return r.first == key; });
    if (it == read.end()) {
      std::vector<double> v;
      if (t.dtype() == DType::I64) {
        for (std::int64_t x : t.to_vector_i64()) v.push_back(static_cast<double>(x));
      } else if (t.dtype() == DType::F64) {
        v.push_back(t.item<double>());
      } else {
        for (float x : t.to_vector()) v.push_back(static_cast<double>(x));
      }
      read.emplace_back(key, std::move(v));
      it = std::prev(read.end());
    }
    return it->second.at(static_cast<std::size_t>(at));
  };
  auto pending = std::move(pending_);
  pending_.clear();
  for (const auto& [name, p] : pending) {
    double count = p.count_value, sum_value = 0;
    if (p.read) {  // begun earlier: its wait covers only the work before it
      if (p.count_of.defined()) count = p.read->value(p.count_read, p.count_at);
      sum_value = p.read->value(p.sum_read, p.sum_at);
    } else {
      if (p.count_of.defined()) count = value(p.count_of, p.count_at);
      sum_value = value(p.sum_of, p.sum_at);
    }
    const double sum = p.scale * sum_value * (p.sum_times_count ? count : 1.0);
    for (auto& e : entries_) {
      if (e.name == name) {
        e.sum += sum;
        e.count += count;
        break;
      }
    }
  }
}

const std::vector<Metrics::Entry>& Metrics::entries() const {
  settle();
  return entries_;
}

std::vector<Metrics::Entry>& Metrics::entries() {
  settle();
  return entries_;
}

bool Metrics::has(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return true;
  return false;
}

double Metrics::mean(const std::string& name) const {
  settle();
  for (const auto& e : entries_)
    if (e.name == name) return e.mean();
  return 0.0;
}

double Metrics::sum(const std::string& name) const {
  settle();
  for (const auto& e : entries_)
    if (e.name == name) return e.sum;
  return 0.0;
}

double Metrics::count(const std::string& name) const {
  settle();
  for (const auto& e : entries_)
    if (e.name == name) return e.count;
  return 0.0;
}

Tensor top1_hits(const Tensor& logits, const Tensor& labels, std::int64_t ignore_index) {
  const Tensor pred = kernels::argmax_last(logits);
  if (pred.numel() != labels.numel() || labels.dtype() != DType::I64) {
    throw std::invalid_argument("top1_hits: " + logits.shape().str() + " logits against " +
                                labels.shape().str() + " labels");
  }
  return kernels::count_matches(pred, labels, ignore_index);
}

namespace {

// Class labels have no ignored value.
constexpr std::int64_t kNoIgnore = std::numeric_limits<std::int64_t>::min();

// "loss" as a sum over `units`: the mean times their number, read later.
void add_loss(Metrics& m, const Tensor& loss, double units) {
  Metrics::Pending p;
  p.sum_of = loss;
  p.scale = units;
  p.count_value = units;
  m.add_pending("loss", p);
}

// "accuracy" over `rows`: the hits of `hits` ([hits, counted]), read later.
void add_accuracy(Metrics& m, const Tensor& hits, double rows) {
  Metrics::Pending p;
  p.sum_of = hits;
  p.count_value = rows;
  m.add_pending("accuracy", p);
}

}  // namespace

// ---- built-in objectives ----------------------------------------------------------------------

ObjectiveResult Classification::compute(const Tensor& outputs, const Batch& batch) const {
  ObjectiveResult r;
  Tensor predicted;  // top1_hits' argmax, from the loss's pass over the logits
  // Nothing here reads the outputs after the loss (spends_outputs).
  r.loss = cross_entropy(outputs, batch.targets, smoothing_, -100, &predicted, outputs_spent());
  const auto rows = static_cast<double>(batch.rows());
  add_loss(r.metrics, r.loss, rows);
  add_accuracy(r.metrics, kernels::count_matches(predicted, batch.targets, kNoIgnore), rows);
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
  Tensor predicted;  // top1_hits' argmax, from the loss's pass over the logits
  // Nothing here reads the outputs after the loss (spends_outputs).
  r.loss = cross_entropy(outputs, batch.targets, smoothing_, ignore_, &predicted, outputs_spent());
  // The loss is a mean over the counted tokens; both sums wait on the device with the counts.
  const Tensor counts = kernels::count_matches(predicted, batch.targets, ignore_);
  Metrics::Pending loss;
  loss.sum_of = r.loss;
  loss.sum_times_count = true;
  loss.count_of = counts;
  loss.count_at = 1;
  r.metrics.add_pending("loss", loss);
  Metrics::Pending hits;
  hits.sum_of = counts;
  hits.count_of = counts;
  hits.count_at = 1;
  r.metrics.add_pending("token_accuracy", hits);
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
  add_accuracy(r.metrics, top1_hits(outputs, kernels::argmax_last(batch.targets), kNoIgnore), rows);
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
    add_accuracy(r.metrics, top1_hits(outputs, batch.targets), rows);
  }
  return r;
}

}  // namespace hpm::nn
