#include "hpm/distribute/replica_step.h"

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include "hpm/autograd/weight_cast.h"
#include "hpm/trace/trace.h"

namespace hpm::distribute {

std::vector<std::pair<std::int64_t, std::int64_t>> micro_batches(std::int64_t rows, int steps) {
  if (steps < 1) {
    throw std::invalid_argument("accumulation_steps must be at least 1, got " +
                                std::to_string(steps));
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const std::int64_t each = (rows + steps - 1) / steps;
  for (std::int64_t begin = 0; begin < rows; begin += each)
    out.emplace_back(begin, std::min(each, rows - begin));
  return out;
}

void WeightedLoss::read() {
  value = unscaled.item();
  finite = std::isfinite(value);
}

WeightedLoss weighted_loss(const nn::Objective& objective, const Tensor& outputs,
                           const nn::Batch& micro, double scale, bool read_now) {
  nn::ObjectiveResult r = objective.compute(outputs, micro);
  WeightedLoss w;
  w.unscaled = r.loss.detach();
  w.metrics = std::move(r.metrics);
  w.loss = scale != 1.0 ? mul(r.loss, static_cast<float>(scale)) : r.loss;
  if (read_now) w.read();
  return w;
}

void ReplicaStepResult::settle() {
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const auto value = static_cast<float>(reads[i]->value(0));  // the loss, first
    if (!std::isfinite(value) && finite) {
      finite = false;
      bad_value = value;
    }
    if (i > 0) continue;
    for (std::size_t k = 1; k <= read_with_count; ++k) read_with.push_back(reads[i]->value(k));
  }
  reads.clear();
  metrics.settle();  // their values are in the reads just waited for
}

ReplicaStepResult replica_step(nn::Module& model, const nn::Objective& objective,
                               const nn::Batch& batch, const ReplicaStepOptions& o) {
  ReplicaStepResult out;
  out.rows = batch.rows();
  out.read_with_count = o.read_later ? o.read_with.size() : 0;
  const autograd::AutocastScope precision(o.precision);
  const autograd::Bf16OutputsScope outputs_as_read(objective.reads_bf16_outputs());
  const autograd::WeightCastScope weights_once;  // no parameter changes until the optimizer's
  const auto micro = micro_batches(batch.rows(), o.micro_batches);
  // A whole batch that is the whole step needs no weights (its scale is R): a language model's
  // weight counts the batch's tokens, a read of the targets the device would wait for.
  const bool whole = micro.size() == 1 && o.step_weight <= 0;
  const double step_weight = whole               ? 0.0
                             : o.step_weight > 0 ? o.step_weight
                                                 : objective.weight(batch);
  Reducer* reducer = o.reducer;
  if (o.read_later && (reducer != nullptr || o.on_loss)) {
    throw std::invalid_argument(
        "replica_step: read_later leaves the verdict to the caller; a reducer or on_loss needs "
        "it before the backward");
  }
  const bool read_at_end = reducer == nullptr && !o.on_loss;
  std::vector<Tensor> losses;  // read at the end
  for (std::size_t m = 0; m < micro.size(); ++m) {
    const bool last = m + 1 == micro.size();
    // Micro-batches before the last accumulate locally; the last one's backward reduces the sum.
    std::optional<NoSync> local_only;
    if (reducer && !last) local_only.emplace(*reducer);
    if (reducer && last) reducer->prepare_for_backward();
    const auto [begin, count] = micro[m];
    const nn::Batch part =
        micro.size() == 1 && count == batch.rows() ? batch : batch.slice(begin, count);
    Tensor outputs = model.forward(part.inputs);
    const auto replicas = static_cast<double>(o.replicas_in_sync);
    const double part_weight = whole ? -1.0 : objective.weight(part);
    const double scale = whole ? replicas : replicas * part_weight / step_weight;
    WeightedLoss w = [&] {
      // This handle on the outputs, the only one, goes once the objective has their loss.
      const OutputsSpentScope spent(objective.spends_outputs());
      return weighted_loss(objective, outputs, part, scale, !read_at_end);
    }();
    outputs = Tensor();  // its memory is the loss's to reuse in backward (a classifier's logits)
    // A part with nothing to count (every target ignored) adds nothing to the step: its mean loss
    // is 0/0, NaN, as torch's over no tokens, but its gradients are zeros and its weight is 0.
    // It stopped the run as a NaN loss, though the whole batch's loss was finite.
    const bool nothing_counted = part_weight == 0.0;
    if (!nothing_counted && !o.read_later) out.metrics.merge(w.metrics);
    if (o.read_later) {
      if (!nothing_counted) {
        std::vector<Tensor> with{w.unscaled};
        if (out.reads.empty()) with.insert(with.end(), o.read_with.begin(), o.read_with.end());
        out.reads.push_back(w.metrics.begin_read(with));
        out.losses.push_back(w.unscaled);
        out.metrics.merge(w.metrics);  // the pending values, with their read
      }
    } else if (read_at_end) {
      if (!nothing_counted) losses.push_back(w.unscaled);
    } else {
      if (o.on_loss) o.on_loss(nothing_counted || w.finite);
      if (!nothing_counted && !w.finite && out.finite) {
        out.finite = false;
        out.bad_value = w.value;
      }
      if (!out.finite && reducer == nullptr) return out;  // nobody waits for its gradients
    }
    trace::Span span("backward", "compute");
    w.loss.backward();
  }
  // A replica without rows still takes part: its gradients count as zeros.
  if (reducer && micro.empty()) reducer->prepare_for_backward();
  if (reducer) reducer->finalize();
  if (read_at_end && !o.read_later) {
    out.metrics.settle();  // the one wait: every later read finds its value done
    for (const Tensor& loss : losses) {
      const float value = loss.item();
      if (!std::isfinite(value) && out.finite) {
        out.finite = false;
        out.bad_value = value;
      }
    }
  }
  return out;
}

}  // namespace hpm::distribute
