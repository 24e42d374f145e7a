#include "hpm/distill/noisy_student.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/ops.h"
#include "hpm/nn/losses.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/train/trainer.h"

namespace hpm::distill {

namespace {

// Rows `rows` of `t` (N, ...) gathered into a new (rows.size(), ...) tensor.
Tensor gather_rows(const Tensor& t, const std::vector<std::int64_t>& rows) {
  if (rows.empty()) {
    Shape shape = t.shape();
    shape.dims()[0] = 0;
    return Tensor::empty(shape, t.dtype());
  }
  return kernels::index_select0(t, rows);
}

// a then b along rows (same row shape and dtype).
Tensor concat_rows(const Tensor& a, const Tensor& b) {
  Shape shape = a.shape();
  shape.dims()[0] = a.size(0) + b.size(0);
  Tensor out = Tensor::empty(shape, a.dtype());
  if (a.numel() > 0) out.narrow(0, a.size(0)).copy_(a);
  if (b.numel() > 0) out.narrow(a.size(0), b.size(0)).copy_(b);
  return out;
}

}  // namespace

// ---- pseudo-labels ------------------------------------------------------------------------------

Tensor one_hot(const Tensor& labels, std::int64_t classes) {
  const std::int64_t n = labels.numel();
  const std::vector<std::int64_t> y = labels.to_vector_i64();
  std::vector<float> o(static_cast<std::size_t>(n * classes), 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    if (y[i] < 0 || y[i] >= classes) {
      throw std::invalid_argument("one_hot: label " + std::to_string(y[i]) + " outside [0, " +
                                  std::to_string(classes) + ")");
    }
    o[static_cast<std::size_t>(i * classes + y[i])] = 1.0f;
  }
  return Tensor::from(o, {n, classes});
}

PseudoLabels pseudo_label(const Tensor& teacher_probs, const PseudoLabelOptions& options) {
  if (teacher_probs.dim() != 2) throw std::invalid_argument("pseudo_label: expected (N, C)");
  if (!(options.confidence_threshold >= 0.0f && options.confidence_threshold <= 1.0f)) {
    throw std::invalid_argument("pseudo_label: confidence_threshold must be in [0, 1]");
  }
  if (options.per_class < 0) throw std::invalid_argument("pseudo_label: per_class < 0");
  const std::int64_t n = teacher_probs.size(0), c = teacher_probs.size(1);
  const std::vector<float> p = teacher_probs.to_vector();
  std::vector<std::int64_t> top(static_cast<std::size_t>(n));
  std::vector<float> confidence(static_cast<std::size_t>(n));
  std::vector<std::int64_t> rows;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = p.data() + i * c;
    top[i] = std::max_element(row, row + c) - row;
    confidence[i] = row[top[i]];
    if (confidence[i] >= options.confidence_threshold) rows.push_back(i);
  }
  if (options.balance_classes && !rows.empty()) {
    std::vector<std::vector<std::int64_t>> by_class(static_cast<std::size_t>(c));
    for (std::int64_t r : rows) by_class[top[r]].push_back(r);
    std::int64_t k = options.per_class;
    if (k == 0) {  // the mean count over the classes that have rows, rounded down
      std::int64_t total = 0, present = 0;
      for (const auto& v : by_class) {
        total += static_cast<std::int64_t>(v.size());
        present += v.empty() ? 0 : 1;
      }
      k = std::max<std::int64_t>(1, total / present);
    }
    rows.clear();
    for (auto& v : by_class) {
      if (v.empty()) continue;
      std::stable_sort(v.begin(), v.end(), [&](std::int64_t a, std::int64_t b) {
        return confidence[a] > confidence[b];
      });
      for (std::int64_t j = 0; j < k; ++j)
        rows.push_back(v[static_cast<std::size_t>(j) % v.size()]);
    }
  }
  PseudoLabels out;
  out.rows = rows;
  std::vector<std::int64_t> classes(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) classes[i] = top[rows[i]];
  out.classes = Tensor::from_i64(classes, {static_cast<std::int64_t>(rows.size())});
  out.targets = options.kind == PseudoLabelKind::kHard ? one_hot(out.classes, c)
                                                       : gather_rows(teacher_probs, rows);
  return out;
}

// ---- training on target distributions -----------------------------------------------------------

double fit_targets(nn::Module& model, optim::Optimizer& optimizer, const Tensor& inputs,
                   const Tensor& targets, const TargetFitOptions& options) {
  const std::int64_t n = inputs.size(0);
  if (targets.dim() != 2 || targets.size(0) != n) {
    throw std::invalid_argument("fit_targets: targets must be (N, C) for N inputs");
  }
  if (options.batch_size <= 0) throw std::invalid_argument("fit_targets: batch_size <= 0");
  model.train();
  const float base_lr = optimizer.lr();
  double last_loss = 0;
  // KL(t || softmax(z)): cross-entropy against soft targets less their (constant) entropy.
  const nn::FunctionObjective objective(
      [](const Tensor& logits, const Tensor&, const Tensor& targets) {
        return soft_target_kl(logits, targets, 1.0f);
      },
      "soft_target_kl");
  for (std::int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    if (options.schedule) optimizer.set_lr(options.schedule->lr(base_lr, epoch));
    // A permutation from (seed, epoch): Fisher-Yates.
    Generator gen(options.seed * 1000003ULL + static_cast<std::uint64_t>(epoch));
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    for (std::int64_t i = n - 1; i > 0; --i) {
      std::swap(order[i], order[gen.below(static_cast<std::uint64_t>(i + 1))]);
    }
    const std::int64_t steps = options.drop_last
                                   ? n / options.batch_size
                                   : (n + options.batch_size - 1) / options.batch_size;
    double loss_sum = 0;
    for (std::int64_t s = 0; s < steps; ++s) {
      const std::int64_t begin = s * options.batch_size;
      const std::vector<std::int64_t> rows(order.begin() + begin,
                                           order.begin() + std::min(n, begin + options.batch_size));
      Tensor x = gather_rows(inputs, rows);
      const Tensor t = gather_rows(targets, rows);
      if (!options.augment.empty()) {
        const std::int64_t seed = static_cast<std::int64_t>(gen.next_u64() >> 1);
        x = data::augment_batch({x, t, Tensor::from_i64(std::vector<std::int64_t>{seed}, {1})},
                                options.augment)[0];
      }
      optimizer.zero_grad();
      const distribute::ReplicaStepResult step =
          distribute::replica_step(model, objective, {x, t}, {});
      if (!step.finite) {
        throw train::TrainingError("noisy student: loss is not finite at epoch " +
                                   std::to_string(epoch + 1) + ", step " + std::to_string(s + 1));
      }
      optimizer.step();
      loss_sum += step.metrics.mean("loss");
    }
    last_loss = steps > 0 ? loss_sum / static_cast<double>(steps) : 0.0;
  }
  optimizer.set_lr(base_lr);
  return last_loss;
}

// ---- the round loop -----------------------------------------------------------------------------

std::vector<NoisyStudentRound> noisy_student(
    std::shared_ptr<nn::Module> teacher, const StudentFactory& student,
    const data::LabelledData& labelled, const Tensor& unlabelled, const data::LabelledData* test,
    const NoisyStudentOptions& options,
    const std::function<void(const NoisyStudentRound&)>& on_round) {
  if (!teacher) throw std::invalid_argument("noisy_student: no teacher");
  if (options.rounds < 1) throw std::invalid_argument("noisy_student: rounds must be >= 1");
  std::vector<NoisyStudentRound> history;
  for (int r = 1; r <= options.rounds; ++r) {
    // The teacher labels without noise: eval mode (dropout off), plain inputs.
    const Tensor probs = softmax(predict_logits(*teacher, unlabelled), -1);
    const PseudoLabels pl = pseudo_label(probs, options.pseudo);
    const std::int64_t classes = probs.size(1);
    const Tensor inputs = concat_rows(labelled.inputs, gather_rows(unlabelled, pl.rows));
    const Tensor targets = concat_rows(one_hot(labelled.labels, classes), pl.targets);

    TargetFitOptions fit = options.fit;
    fit.seed = options.fit.seed + static_cast<std::uint64_t>(r);
    manual_seed(fit.seed);  // the student's initialization
    std::shared_ptr<nn::Module> model = student.make_model();
    std::shared_ptr<optim::Optimizer> optimizer = student.make_optimizer(*model);
    fit_targets(*model, *optimizer, inputs, targets, fit);

    NoisyStudentRound round;
    round.round = r;
    round.pseudo_labelled = static_cast<std::int64_t>(pl.rows.size());
    if (test != nullptr && test->size() > 0)
      round.test_accuracy = ensemble_accuracy({model}, *test);
    round.teacher = teacher;
    round.student = model;
    if (on_round) on_round(round);
    history.push_back(round);
    teacher = model;  // the student becomes the next round's teacher
  }
  return history;
}

}  // namespace hpm::distill
