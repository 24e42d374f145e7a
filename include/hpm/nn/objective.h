// Objective: what a batch's loss and metrics are, apart from how the model is run (Keras'
// compute_loss / compute_metrics). One training step (dist/replica_step.h) serves every objective
// on every path: the Trainer, each strategy, the pipeline's last stage, the parameter-server
// worker and distillation.
//
// The loss is a mean over the batch's weight units (rows for a classifier, counted tokens for a
// language model); weight() says how many a batch holds, so micro-batches and replicas of
// unequal size are weighted exactly. Metrics are named sums with counts, so they add up across
// micro-batches and replicas before their means are taken.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "hpm/autograd/ops.h"
#include "hpm/tensor/host_read.h"

namespace hpm::nn {

// A batch: inputs and targets, row-aligned (images and labels; token windows and next tokens).
struct Batch {
  Tensor inputs, targets;
  std::int64_t rows() const { return inputs.size(0); }
  Batch slice(std::int64_t begin, std::int64_t count) const {
    return {inputs.narrow(begin, count), targets.narrow(begin, count)};
  }
};

// Named sums and counts; the value of a metric is sum / count. "loss" is always present.
//
// A sum or count may still be on a device (add_pending): the objective leaves its loss and
// accuracy counts there, and they are read only when a value of these metrics is first asked for
// (every pending one then, after a single wait for the device), so that a GPU's training step
// synchronizes with the host once, at its end, rather than at each metric. begin_read() starts
// that read early (after the forward that made them), so that the wait at the end covers the
// forward only.
class Metrics {
 public:
  Metrics() = default;
  // Each name with a zero sum and count, in order.
  explicit Metrics(const std::vector<std::string>& names);
  struct Entry {
    std::string name;
    double sum = 0, count = 0;
    double mean() const { return count > 0 ? sum / count : 0.0; }
  };
  void add(const std::string& name, double sum, double count);
  // Adds sum = scale * sum_of[sum_at] (times the count when sum_times_count: a mean over the
  // counted units) and count = count_of[count_at], or `count_value` when count_of is undefined;
  // the tensors' values (F32, F64 or I64) are read later. The entry takes its place now.
  struct Pending {
    Tensor sum_of;
    std::int64_t sum_at = 0;
    double scale = 1.0;
    bool sum_times_count = false;
    Tensor count_of;
    std::int64_t count_at = 0;
    double count_value = 0;
    // Set by begin_read: the read that holds sum_of's and count_of's values, and their places.
    std::shared_ptr<HostRead> read;
    std::size_t sum_read = 0, count_read = 0;
  };
  void add_pending(const std::string& name, const Pending& pending);
  // Begins reading `with` and every pending tensor that no read holds yet, in one HostRead
  // (`with` first, in order): later reads of these metrics wait only for the work issued before
  // this call. Returns the read (empty when there was nothing to read).
  std::shared_ptr<HostRead> begin_read(const std::vector<Tensor>& with = {});
  void merge(const Metrics& other);  // adds every entry, by name
  bool has(const std::string& name) const;
  double mean(const std::string& name) const;  // 0 when absent or empty
  double sum(const std::string& name) const;   // 0 when absent
  double count(const std::string& name) const;
  const std::vector<Entry>& entries() const;
  std::vector<Entry>& entries();
  // Reads what is pending (each tensor once); every accessor above does this first.
  void settle() const;

 private:
  mutable std::vector<Entry> entries_;
  mutable std::vector<std::pair<std::string, Pending>> pending_;
};

struct ObjectiveResult {
  Tensor loss;      // scalar, the mean over the batch's weight units; differentiable
  Metrics metrics;  // "loss" (its sum over the units) and the objective's own
};

class Objective {
 public:
  virtual ~Objective() = default;
  // The loss and metrics of `outputs` (the model's, on batch.inputs) against the batch.
  virtual ObjectiveResult compute(const Tensor& outputs, const Batch& batch) const = 0;
  // How many units the loss of `batch` is a mean over.
  virtual double weight(const Batch& batch) const { return static_cast<double>(batch.rows()); }
  // The names compute() reports for `batch`, in its order: what replicas and stages that have
  // no rows (or no outputs) contribute zeros to, so that reductions line up by position.
  virtual std::vector<std::string> metric_names(const Batch& batch) const = 0;
  // Metrics derived from the reduced ones for display ("perplexity" = exp(loss)); appended.
  virtual void derive(Metrics&) const {}
  // The objective evaluation (Trainer::evaluate) measures with; null: plain classification (a
  // label-smoothed run is evaluated on its labels alone, a distilled or codistilled one by its
  // base objective, without the teachers' term).
  virtual const Objective* evaluation() const { return nullptr; }
  // Whether compute() reads bf16 outputs as they are (autograd::bf16_outputs): its every use of
  // them accepts BF16 (cross-entropy, top-1 hits).
  virtual bool reads_bf16_outputs() const { return false; }
  // Whether compute() reads the outputs last through its cross_entropy: a training step, which
  // drops them once it has the loss, then opens an autograd::OutputsSpentScope around compute(),
  // and compute() passes outputs_spent() as cross_entropy's logits_spent (their gradient written
  // over them in the forward). An objective that reads them after its loss, or wraps one that
  // spends them (a distillation's), must answer false: its base then sees no scope.
  virtual bool spends_outputs() const { return false; }
  virtual std::string name() const = 0;
};

// Cross-entropy of class logits (N, C) against labels (N), with label smoothing; "accuracy".
class Classification : public Objective {
 public:
  explicit Classification(float label_smoothing = 0.0f) : smoothing_(label_smoothing) {}
  ObjectiveResult compute(const Tensor& outputs, const Batch& batch) const override;
  std::vector<std::string> metric_names(const Batch&) const override {
    return {"loss", "accuracy"};
  }
  bool reads_bf16_outputs() const override { return true; }
  // This class itself; a subclass may read the outputs after this compute(): it spends them only
  // where it says so.
  bool spends_outputs() const override { return typeid(*this) == typeid(Classification); }
  std::string name() const override { return "classification"; }

 private:
  float smoothing_;
};

// Next-token cross-entropy of logits (B, T, V) against targets (B, T), positions equal to
// ignore_index excluded, with label smoothing (per token, as Classification per row); weight =
// counted tokens. "token_accuracy"; derives "perplexity". Evaluation measures without the
// smoothing.
class LanguageModelling : public Objective {
 public:
  explicit LanguageModelling(std::int64_t ignore_index = -100, float label_smoothing = 0.0f);
  ObjectiveResult compute(const Tensor& outputs, const Batch& batch) const override;
  double weight(const Batch& batch) const override;
  std::vector<std::string> metric_names(const Batch&) const override {
    return {"loss", "token_accuracy"};
  }
  void derive(Metrics& m) const override;
  const Objective* evaluation() const override { return plain_ ? plain_.get() : this; }
  bool reads_bf16_outputs() const override { return true; }
  // As Classification's.
  bool spends_outputs() const override { return typeid(*this) == typeid(LanguageModelling); }
  std::string name() const override { return "language_modelling"; }

 private:
  std::int64_t ignore_;
  float smoothing_;
  std::shared_ptr<const LanguageModelling> plain_;  // the unsmoothed objective, when smoothing
};

// Cross-entropy against target distributions (N, C) (soft labels, a teacher's probabilities):
// -sum_c p_c log softmax(outputs)_c, row mean. "accuracy" against the targets' argmax.
class SoftTargets : public Objective {
 public:
  ObjectiveResult compute(const Tensor& outputs, const Batch& batch) const override;
  std::vector<std::string> metric_names(const Batch&) const override {
    return {"loss", "accuracy"};
  }
  std::string name() const override { return "soft_targets"; }
};

// A loss of (outputs, targets), the mean over rows: what strategies and pipelines took before
// objectives (their train_step overloads wrap it in a FunctionObjective).
using LossFn = std::function<Tensor(const Tensor& outputs, const Tensor& targets)>;

// A loss written as a function, (outputs, inputs, targets) -> mean over rows: custom losses and
// distillation (whose teachers run on the inputs). Reports "loss" and, for class-index targets,
// "accuracy".
using LossFunction =
    std::function<Tensor(const Tensor& outputs, const Tensor& inputs, const Tensor& targets)>;
class FunctionObjective : public Objective {
 public:
  FunctionObjective(LossFunction loss, std::string name);
  ObjectiveResult compute(const Tensor& outputs, const Batch& batch) const override;
  std::vector<std::string> metric_names(const Batch& batch) const override;
  std::string name() const override { return name_; }

 private:
  LossFunction loss_;
  std::string name_;
};

// Top-1 hits of logits (..., C) against class indices (...) (I64); positions equal to
// ignore_index are not counted. An I64 (2) tensor [hits, counted], left on the logits' device.
Tensor top1_hits(const Tensor& logits, const Tensor& labels, std::int64_t ignore_index = -100);

}  // namespace hpm::nn
