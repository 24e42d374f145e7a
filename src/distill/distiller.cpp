#include "hpm/distill/distiller.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/ops.h"
#include "hpm/nn/losses.h"
#include "hpm/tensor/kernels.h"

namespace hpm::distill {

namespace {

void check_alpha(float alpha) {
  if (!(alpha >= 0.0f && alpha <= 1.0f)) {
    throw std::invalid_argument("distillation alpha must be in [0, 1], got " +
                                std::to_string(alpha));
  }
}

void check_temperature(float temperature) {
  if (!(temperature > 0.0f)) {
    throw std::invalid_argument("distillation temperature must be positive, got " +
                                std::to_string(temperature));
  }
}

}  // namespace

// ---- losses -------------------------------------------------------------------------------------

Tensor soft_target_kl(const Tensor& student_logits, const Tensor& target_probs, float temperature) {
  check_temperature(temperature);
  check_shape(target_probs, student_logits.shape(), "distillation: soft targets");
  Tensor log_student = log_softmax(mul(student_logits, 1.0f / temperature), -1);
  // detach(): the targets are constants even if a caller built them with gradients on.
  return mul(kl_div(log_student, target_probs.detach()), temperature * temperature);
}

Tensor rows_of(const Tensor& t) {
  const std::int64_t c = t.size(t.dim() - 1);
  return reshape(t, Shape{t.numel() / c, c});
}

Tensor blend_with_soft_targets(const Tensor& base_loss, const Tensor& student_logits,
                               const Tensor& target_probs, float alpha, float temperature) {
  check_alpha(alpha);
  const Tensor soft = soft_target_kl(rows_of(student_logits), rows_of(target_probs), temperature);
  return add(mul(base_loss, 1.0f - alpha), mul(soft, alpha));
}

Tensor soft_target_loss(const Tensor& student_logits, const Tensor& target_probs,
                        const Tensor& labels, float alpha, float temperature) {
  check_alpha(alpha);
  Tensor hard = cross_entropy(student_logits, labels);
  Tensor soft = soft_target_kl(student_logits, target_probs, temperature);
  return add(mul(hard, 1.0f - alpha), mul(soft, alpha));
}

// ---- distiller ----------------------------------------------------------------------------------

Distiller::Distiller(std::vector<Teacher> teachers, DistillOptions options)
    : teachers_(std::move(teachers)), options_(options) {
  check_alpha(options_.alpha);
  check_temperature(options_.temperature);
  if (teachers_.empty()) throw std::invalid_argument("Distiller: no teacher");
  float total = 0.0f;
  for (const Teacher& t : teachers_) {
    if (!t.model) throw std::invalid_argument("Distiller: a teacher has no model");
    if (!(t.weight >= 0.0f)) {
      throw std::invalid_argument("Distiller: teacher weights must be non-negative, got " +
                                  std::to_string(t.weight));
    }
    total += t.weight;
  }
  if (!(total > 0.0f)) throw std::invalid_argument("Distiller: teacher weights sum to zero");
  for (Teacher& t : teachers_) {
    t.weight /= total;
    t.model->eval();
  }
}

Tensor Distiller::soft_targets(const Tensor& inputs) const {
  return options_.cache_targets ? cached_targets(inputs) : teacher_targets(inputs);
}

Tensor Distiller::cached_targets(const Tensor& inputs) const {
  const std::int64_t n = inputs.size(0);
  if (n == 0) return teacher_targets(inputs);
  const std::size_t row_bytes = inputs.nbytes() / static_cast<std::size_t>(n);
  const std::string all_bytes = inputs.to_bytes();  // the rows' keys are hashes of their bytes
  const char* bytes = all_bytes.data();
  std::vector<std::uint64_t> keys(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    keys[i] = std::hash<std::string_view>{}(
        std::string_view(bytes + static_cast<std::size_t>(i) * row_bytes, row_bytes));
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  // The rows never seen: run the teachers on them alone, gathered into one batch.
  std::vector<std::int64_t> missing;
  for (std::int64_t i = 0; i < n; ++i)
    if (!cache_index_.count(keys[i])) missing.push_back(i);
  if (!missing.empty()) {
    const Tensor t = teacher_targets(kernels::index_select0(inputs, missing));
    if (target_shape_.rank() == 0) target_shape_ = t.shape();
    const std::vector<float> values = t.to_vector();
    const std::size_t c = values.size() / missing.size();
    for (std::size_t j = 0; j < missing.size(); ++j) {
      // A row repeated within the batch is stored once.
      if (cache_index_.emplace(keys[missing[j]], cache_values_.size()).second) {
        cache_values_.insert(cache_values_.end(),
                             values.begin() + static_cast<std::ptrdiff_t>(j * c),
                             values.begin() + static_cast<std::ptrdiff_t>((j + 1) * c));
      }
    }
  }
  misses_ += static_cast<std::int64_t>(missing.size());
  hits_ += n - static_cast<std::int64_t>(missing.size());
  const std::size_t c = cache_values_.size() / cache_index_.size();
  Shape shape = target_shape_;
  shape.dims()[0] = n;
  std::vector<float> out(static_cast<std::size_t>(n) * c);
  for (std::int64_t i = 0; i < n; ++i) {
    std::copy_n(cache_values_.data() + cache_index_.at(keys[i]), c,
                out.data() + static_cast<std::size_t>(i) * c);
  }
  return Tensor::from(out, shape);
}

Tensor Distiller::teacher_targets(const Tensor& inputs) const {
  NoGradGuard no_grad;
  Tensor targets;
  for (const Teacher& t : teachers_) {
    if (t.weight == 0.0f) continue;
    // Someone may have switched the shared model back to training mode since construction. Only
    // then is the mode written, under a lock: replicas of a strategy run this concurrently, and
    // an unconditional eval() would write the flag while another replica's forward reads it.
    if (t.model->is_training()) {
      std::lock_guard<std::mutex> lock(mode_mutex_);
      if (t.model->is_training()) t.model->eval();
    }
    Tensor p =
        mul(softmax(mul(t.model->forward(inputs), 1.0f / options_.temperature), -1), t.weight);
    targets = targets.defined() ? add(targets, p) : p;
  }
  return targets;
}

Tensor Distiller::loss(const Tensor& inputs, const Tensor& student_logits,
                       const Tensor& labels) const {
  // alpha = 0 is training on labels alone: no need to run the teachers.
  if (options_.alpha == 0.0f) return cross_entropy(student_logits, labels);
  return soft_target_loss(student_logits, soft_targets(inputs), labels, options_.alpha,
                          options_.temperature);
}

train::InputLossFn Distiller::loss_fn() const {
  return
      [this](const Tensor& x, const Tensor& logits, const Tensor& y) { return loss(x, logits, y); };
}

DistillationObjective::DistillationObjective(std::shared_ptr<const Distiller> distiller,
                                             std::shared_ptr<const nn::Objective> base)
    : distiller_(std::move(distiller)),
      base_(base ? std::move(base) : std::make_shared<nn::Classification>()) {
  if (!distiller_) throw std::invalid_argument("DistillationObjective: no distiller");
}

nn::ObjectiveResult DistillationObjective::compute(const Tensor& outputs,
                                                   const nn::Batch& batch) const {
  nn::ObjectiveResult r = base_->compute(outputs, batch);
  const DistillOptions& o = distiller_->options();
  // alpha = 0 is training on the base objective alone: no need to run the teachers.
  if (o.alpha == 0.0f) return r;
  r.loss = blend_with_soft_targets(r.loss, outputs, distiller_->soft_targets(batch.inputs), o.alpha,
                                   o.temperature);
  return r;
}

void attach(train::Trainer& trainer, std::shared_ptr<const Distiller> distiller,
            std::shared_ptr<const nn::Objective> base) {
  trainer.set_objective(
      std::make_shared<DistillationObjective>(std::move(distiller), std::move(base)));
}

// ---- evaluation ---------------------------------------------------------------------------------

Tensor predict_logits(nn::Module& model, const Tensor& inputs, std::int64_t batch_size) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  std::vector<Tensor> parts;
  for (std::int64_t begin = 0; begin < inputs.size(0); begin += batch_size) {
    const std::int64_t n = std::min(batch_size, inputs.size(0) - begin);
    parts.push_back(rows_of(model.forward(inputs.narrow(begin, n))).clone());
  }
  model.train(was_training);
  if (parts.size() <= 1) return parts.empty() ? Tensor() : parts.front();
  return kernels::concat(parts, 0);
}

Tensor ensemble_probabilities(const std::vector<std::shared_ptr<nn::Module>>& models,
                              const Tensor& inputs, std::int64_t batch_size) {
  if (models.empty()) throw std::invalid_argument("ensemble: no model");
  NoGradGuard no_grad;
  Tensor sum_p;
  for (const auto& m : models) {
    Tensor p = softmax(predict_logits(*m, inputs, batch_size), -1);
    sum_p = sum_p.defined() ? add(sum_p, p) : p;
  }
  return mul(sum_p, 1.0f / static_cast<float>(models.size()));
}

double ensemble_accuracy(const std::vector<std::shared_ptr<nn::Module>>& models,
                         const data::LabelledData& data, std::int64_t batch_size) {
  if (data.size() == 0) return 0.0;
  // top-1 of the averaged probabilities: top1_correct only needs an argmax per row.
  const Tensor p = ensemble_probabilities(models, data.inputs, batch_size);
  return static_cast<double>(nn::top1_correct(p, data.labels.reshape({p.size(0)}))) /
         static_cast<double>(p.size(0));
}

EnsembleScore evaluate_ensemble(const std::vector<Teacher>& teachers,
                                const data::LabelledData& data, std::int64_t batch_size) {
  const Distiller ensemble(teachers, {0.5f, 1.0f, false});
  double nll = 0;
  std::int64_t correct = 0, rows = 0;
  for (std::int64_t begin = 0; begin < data.size(); begin += batch_size) {
    const std::int64_t n = std::min<std::int64_t>(batch_size, data.size() - begin);
    const Tensor p = rows_of(ensemble.soft_targets(data.inputs.narrow(begin, n)));
    const Tensor y = data.labels.narrow(begin, n).reshape({p.size(0)});
    const std::vector<float> pd = p.to_vector();
    const std::vector<std::int64_t> yd = y.to_vector_i64();
    const std::int64_t classes = p.size(1);
    for (std::int64_t i = 0; i < p.size(0); ++i)
      nll -= std::log(std::max(pd[static_cast<std::size_t>(i * classes + yd[i])], 1e-30f));
    correct += nn::top1_correct(p, y);
    rows += p.size(0);
  }
  if (rows == 0) return {};
  return {nll / static_cast<double>(rows), static_cast<double>(correct) / static_cast<double>(rows),
          rows};
}

// ---- M on M -------------------------------------------------------------------------------------

std::vector<std::shared_ptr<nn::Module>> distill_one_per_teacher(
    const std::vector<Teacher>& teachers, const StudentFactory& student, const data::Dataset& train,
    const train::FitOptions& fit, const DistillOptions& options) {
  std::vector<std::shared_ptr<nn::Module>> students;
  for (const Teacher& t : teachers) {
    auto model = student.make_model();
    train::Trainer trainer(model, student.make_optimizer(*model));
    attach(trainer,
           std::make_shared<const Distiller>(std::vector<Teacher>{{t.model, 1.0f}}, options));
    trainer.fit(train, nullptr, fit);
    students.push_back(std::move(model));
  }
  return students;
}

// ---- churn --------------------------------------------------------------------------------------

Churn churn(const Tensor& logits_a, const Tensor& logits_b, const Tensor& labels) {
  check_shape(logits_b, logits_a.shape(), "churn: logits_b");
  if (logits_a.dim() != 2 || labels.numel() != logits_a.size(0)) {
    throw std::invalid_argument("churn: expected (N, C) logits and N labels");
  }
  const Tensor pa = kernels::argmax_last(logits_a), pb = kernels::argmax_last(logits_b);
  const std::vector<std::int64_t> a = pa.to_vector_i64(), b = pb.to_vector_i64();
  const std::vector<std::int64_t> y = labels.to_vector_i64();
  Churn c;
  c.examples = labels.numel();
  std::int64_t differ = 0, good = 0, bad = 0;
  for (std::int64_t i = 0; i < c.examples; ++i) {
    if (a[i] == b[i]) continue;
    ++differ;
    good += a[i] != y[i] && b[i] == y[i];
    bad += a[i] == y[i] && b[i] != y[i];
  }
  if (c.examples > 0) {
    const double n = static_cast<double>(c.examples);
    c.churn = static_cast<double>(differ) / n;
    c.good_churn = static_cast<double>(good) / n;
    c.bad_churn = static_cast<double>(bad) / n;
  }
  return c;
}

}  // namespace hpm::distill
