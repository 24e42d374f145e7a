// Noisy Student (Xie et al. 2020): self-training with an equal-or-larger, noised student.
//
//   teacher_0 = a model trained on the labelled data alone
//   for round r = 1..R:
//     pseudo-label the unlabelled data with teacher_{r-1} (eval mode, no noise): soft
//       probabilities or hard one-hot labels, optionally only the rows whose top probability
//       reaches a confidence threshold, optionally balanced to the same count per class
//     train a fresh student on labelled + pseudo-labelled rows under noise (its dropout layers,
//       random crop and flip of its inputs)
//     teacher_r = student_r
//
// The student learns every row from a target distribution (one-hot for labelled rows), with the
// loss KL(target || softmax(student)) = CE(target, student) - H(target): cross-entropy against
// soft targets, whose gradient it shares.
//
// Shapes: N rows, C classes; probabilities and targets (N, C) F32; labels (N) I64.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "hpm/data/in_memory.h"
#include "hpm/data/input_pipeline.h"
#include "hpm/distill/distiller.h"
#include "hpm/nn/module.h"
#include "hpm/optim/lr_schedule.h"
#include "hpm/tensor/tensor.h"

namespace hpm::distill {

// ---- pseudo-labels ------------------------------------------------------------------------------

enum class PseudoLabelKind { kSoft, kHard };

struct PseudoLabelOptions {
  PseudoLabelKind kind = PseudoLabelKind::kSoft;
  // Keep only rows whose top probability is >= this (0: every row).
  float confidence_threshold = 0.0f;
  // Same number of rows per (predicted) class: classes with more keep their most confident
  // `per_class`, classes with fewer repeat theirs, most confident first, up to `per_class`
  // (a class with none stays empty). per_class 0: the mean count over the classes that have any.
  bool balance_classes = false;
  std::int64_t per_class = 0;
};

struct PseudoLabels {
  std::vector<std::int64_t> rows;  // rows of the unlabelled set, possibly repeated (balancing)
  Tensor targets;                  // (rows.size(), C): the probabilities, or one-hot (hard)
  Tensor classes;                  // (rows.size()) I64: the top-1 class of each
};

// Selects and labels rows from the teacher's class probabilities (N, C). Deterministic: rows keep
// their order, except that balancing lists each class's rows (class by class) by decreasing
// confidence, ties by row.
PseudoLabels pseudo_label(const Tensor& teacher_probs, const PseudoLabelOptions& options);

// (N) I64 labels -> (N, C) one-hot F32.
Tensor one_hot(const Tensor& labels, std::int64_t classes);

// ---- training on target distributions -----------------------------------------------------------

struct TargetFitOptions {
  std::int64_t epochs = 1, batch_size = 64;
  std::uint64_t seed = 0;                       // shuffling and augmentation
  std::vector<data::AugmentOp> augment;         // input noise, e.g. random_crop + random_flip
  std::shared_ptr<optim::LrSchedule> schedule;  // per epoch from the optimizer's lr; null: constant
  bool drop_last = true;
};

// Trains `model` (in training mode, so its dropout is on) on (inputs, targets (N, C)) with
// KL(target || softmax(model(noised input))), shuffled every epoch. Returns the last epoch's mean
// loss. Throws train::TrainingError on a non-finite loss.
double fit_targets(nn::Module& model, optim::Optimizer& optimizer, const Tensor& inputs,
                   const Tensor& targets, const TargetFitOptions& options);

// ---- the round loop -----------------------------------------------------------------------------

struct NoisyStudentOptions {
  int rounds = 1;
  PseudoLabelOptions pseudo;
  TargetFitOptions fit;  // each round's student; seed + round is its seed
};

struct NoisyStudentRound {
  int round = 0;                     // 1-based
  std::int64_t pseudo_labelled = 0;  // rows of the unlabelled set used (with repeats)
  double test_accuracy = -1;         // of this round's student; -1 without test data
  std::shared_ptr<nn::Module> teacher, student;
};

// Runs the rounds from `teacher` (already trained). `student.make_model` builds each round's
// fresh student (equal or larger than the teacher, with its dropout); it is called with the
// default generator seeded from options.fit.seed + round. `on_round` (optional) sees each round
// as it finishes. Returns every round; the last student is the result.
std::vector<NoisyStudentRound> noisy_student(
    std::shared_ptr<nn::Module> teacher, const StudentFactory& student,
    const data::LabelledData& labelled, const Tensor& unlabelled, const data::LabelledData* test,
    const NoisyStudentOptions& options,
    const std::function<void(const NoisyStudentRound&)>& on_round = nullptr);

}  // namespace hpm::distill
