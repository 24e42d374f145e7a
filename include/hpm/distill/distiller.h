// Knowledge distillation (Hinton et al. 2015): a student learns from the temperature-softened
// predictions of one or more frozen teachers as well as from the labels,
//
//   loss = (1 - alpha) CE(student, labels) + alpha T^2 KL(p_teacher^T || softmax(student / T)),
//
// with p_teacher^T the teachers' weighted average of softmax(teacher / T) (TMKD / ensemble soft
// targets). Also here: "M on M" (one student per teacher, then the students' ensemble) and
// prediction churn between two models.
//
// Shapes: N = batch, C = classes; logits and probabilities are (N, C), labels (N) I64. A language
// model's (B, T, V) logits count each position as a row: the KL term is a mean over B*T rows.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "hpm/data/dataset.h"
#include "hpm/data/in_memory.h"
#include "hpm/nn/module.h"
#include "hpm/nn/objective.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/tensor.h"
#include "hpm/train/trainer.h"

namespace hpm::distill {

// ---- losses -------------------------------------------------------------------------------------

// T^2 KL(targets || softmax(student / T)), batch mean. `target_probs` (N, C) are probabilities
// (rows sum to 1) and get no gradient. With targets = softmax(teacher / T) this equals
// nn::distillation_kl; taking probabilities lets several teachers be averaged first.
Tensor soft_target_kl(const Tensor& student_logits, const Tensor& target_probs, float temperature);

// (..., C) -> (rows, C): a language model's positions are rows of a distillation term.
Tensor rows_of(const Tensor& t);

// (1 - alpha) base_loss + alpha soft_target_kl(rows_of(student), rows_of(targets), T): a run's own
// objective (classification, language modelling) blended with the distillation term.
Tensor blend_with_soft_targets(const Tensor& base_loss, const Tensor& student_logits,
                               const Tensor& target_probs, float alpha, float temperature);

// (1 - alpha) CE(student, labels) + alpha soft_target_kl(student, targets, T).
Tensor soft_target_loss(const Tensor& student_logits, const Tensor& target_probs,
                        const Tensor& labels, float alpha, float temperature);

// ---- distiller ----------------------------------------------------------------------------------

struct Teacher {
  std::shared_ptr<nn::Module> model;
  float weight = 1.0f;  // relative: the weights are normalized to sum to 1
};

struct DistillOptions {
  float alpha = 0.9f;        // share of the soft-target term; 0 = labels only
  float temperature = 4.0f;  // T > 0
  // Remember the soft targets of every input row seen (keyed by a 64-bit hash of its bytes), so
  // from the second epoch on the teachers do not run at all. Only for inputs that repeat exactly
  // (no augmentation): augmented rows would never hit and the cache would only grow.
  bool cache_targets = false;
};

// Holds frozen teachers: each is switched to evaluation mode (dropout off, batch norm on its
// running statistics) and only ever run under NoGradGuard, so no graph reaches its parameters and
// no optimizer holds them; their values are never written.
class Distiller {
 public:
  // Throws std::invalid_argument for no teachers, a null model, a negative weight or a zero sum,
  // alpha outside [0, 1] or T <= 0.
  Distiller(std::vector<Teacher> teachers, DistillOptions options);

  // The soft targets of `inputs`: sum_i w_i softmax(teacher_i(inputs) / T) / sum_i w_i, (N, C)
  // (a language model's (B, T, V)). Throws std::invalid_argument when teachers disagree on it.
  // Probabilities, not logits, are averaged: each teacher's distribution counts as a whole,
  // whatever the scale of its logits (the usual ensemble / TMKD choice).
  Tensor soft_targets(const Tensor& inputs) const;

  // The distillation loss of a student's logits for `inputs` (the teachers run on them).
  Tensor loss(const Tensor& inputs, const Tensor& student_logits, const Tensor& labels) const;

  // For train::Trainer::set_input_loss: the trainer passes each batch's inputs along. Refers to
  // this Distiller, which must outlive the trainer; attach() below shares ownership instead.
  train::InputLossFn loss_fn() const;

  const std::vector<Teacher>& teachers() const { return teachers_; }
  const DistillOptions& options() const { return options_; }
  // With cache_targets: rows answered from the cache, and rows the teachers ran on.
  std::int64_t cache_hits() const { return hits_; }
  std::int64_t cache_misses() const { return misses_; }

 private:
  Tensor teacher_targets(const Tensor& inputs) const;  // the teachers, no cache
  Tensor cached_targets(const Tensor& inputs) const;

  std::vector<Teacher> teachers_;
  DistillOptions options_;
  // The cache: row hash -> offset of its C targets in cache_values_.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::uint64_t, std::size_t> cache_index_;
  mutable std::vector<float> cache_values_;
  mutable Shape target_shape_;     // of the first batch the teachers answered
  mutable std::mutex mode_mutex_;  // puts a teacher back in eval mode
  mutable std::int64_t hits_ = 0, misses_ = 0;
};

// The Distiller around a run's own objective (classification by default; language modelling,
// whose positions are the rows): training minimizes
//   (1 - alpha) base loss + alpha T^2 KL(p_teachers^T || softmax(outputs / T)),
// the teachers run on the same batch.inputs. The metrics are the base objective's (its loss among
// them, so curves compare with the student trained alone), and evaluation measures the base
// alone. It runs wherever an objective does: on one device, and under every strategy, each
// replica's teachers on its rows.
class DistillationObjective : public nn::Objective {
 public:
  explicit DistillationObjective(std::shared_ptr<const Distiller> distiller,
                                 std::shared_ptr<const nn::Objective> base = nullptr);
  nn::ObjectiveResult compute(const Tensor& outputs, const nn::Batch& batch) const override;
  double weight(const nn::Batch& batch) const override { return base_->weight(batch); }
  std::vector<std::string> metric_names(const nn::Batch& batch) const override {
    return base_->metric_names(batch);
  }
  void derive(nn::Metrics& m) const override { base_->derive(m); }
  const nn::Objective* evaluation() const override { return base_->evaluation(); }
  std::string name() const override { return "distillation(" + base_->name() + ")"; }

 private:
  std::shared_ptr<const Distiller> distiller_;
  std::shared_ptr<const nn::Objective> base_;
};

// Installs `distiller` around `base` (classification when null) as the objective of `trainer`
// (the student's; one device or a strategy).
void attach(train::Trainer& trainer, std::shared_ptr<const Distiller> distiller,
            std::shared_ptr<const nn::Objective> base = nullptr);

// ---- evaluation ---------------------------------------------------------------------------------

// Logits of `model` on `inputs` in evaluation mode, without gradients, in batches, as rows: (N, C),
// a language model's (B, T, V) as (B*T, V). The model's training mode is restored afterwards.
Tensor predict_logits(nn::Module& model, const Tensor& inputs, std::int64_t batch_size = 1000);

// The ensemble's class probabilities: the mean of the models' softmax(logits), (N, C).
Tensor ensemble_probabilities(const std::vector<std::shared_ptr<nn::Module>>& models,
                              const Tensor& inputs, std::int64_t batch_size = 1000);

// Top-1 accuracy of the ensemble (average of probabilities) on `data`.
double ensemble_accuracy(const std::vector<std::shared_ptr<nn::Module>>& models,
                         const data::LabelledData& data, std::int64_t batch_size = 1000);

// The ensemble of `teachers` scored on `data` (a language model's windows count each position as
// a row): the mean negative log-likelihood of the labels under their weighted average of
// probabilities at temperature 1, and the top-1 accuracy of that average. One teacher scores as
// the model evaluated alone (its cross-entropy and accuracy).
struct EnsembleScore {
  double loss = 0, accuracy = 0;
  std::int64_t rows = 0;
};
EnsembleScore evaluate_ensemble(const std::vector<Teacher>& teachers,
                                const data::LabelledData& data, std::int64_t batch_size = 1000);

// ---- M on M -------------------------------------------------------------------------------------

struct StudentFactory {
  std::function<std::shared_ptr<nn::Module>()> make_model;
  std::function<std::shared_ptr<optim::Optimizer>(nn::Module&)> make_optimizer;
};

// "M on M": one student per teacher, each distilled from that teacher alone on `train` with
// `fit` and `options`; returns the trained students (evaluate them with ensemble_accuracy). Each
// student is built right before its training, so seeding the default generator before this call
// makes the whole run reproducible.
std::vector<std::shared_ptr<nn::Module>> distill_one_per_teacher(
    const std::vector<Teacher>& teachers, const StudentFactory& student, const data::Dataset& train,
    const train::FitOptions& fit, const DistillOptions& options);

// ---- churn --------------------------------------------------------------------------------------

// Prediction churn between models A and B on the same examples (Anil et al. 2018): the share
// whose top-1 predictions differ, split by the labels into good churn (A wrong, B right) and bad
// churn (A right, B wrong); churn - good - bad is the share where both are wrong and disagree.
struct Churn {
  double churn = 0, good_churn = 0, bad_churn = 0;
  std::int64_t examples = 0;
};

Churn churn(const Tensor& logits_a, const Tensor& logits_b, const Tensor& labels);

}  // namespace hpm::distill
