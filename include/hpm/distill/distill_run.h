// `hpm distill CONFIG` as one library call: the [distill] section's teachers loaded from their
// checkpoints or weights (or, for want of a checkpoint, trained from their own configs and saved
// where the checkpoint was expected), the config's model distilled from their ensemble as hpm
// train would train it (one device or its [strategy]; a language model by steps), and, when
// asked, one student per teacher (M on M) and a labels-only baseline with its churn against the
// distilled student. Under `hpm launch` every worker calls it; worker 0 speaks.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hpm/config/config.h"
#include "hpm/config/run_log.h"
#include "hpm/distill/distiller.h"
#include "hpm/nn/module.h"

namespace hpm::distill {

// A model's result on the config's test set (a language model's validation windows): loss and
// (token) accuracy.
struct RunScore {
  double loss = 0, accuracy = 0, seconds = 0;  // seconds: its training, 0 when loaded
  std::int64_t parameters = 0;
};

struct TeacherOutcome {
  std::string config, checkpoint;
  float weight = 1.0f;
  bool trained = false;  // here, for want of a checkpoint
  std::shared_ptr<nn::Module> model;
  RunScore score;
};

struct DistillationOutcome {
  std::vector<TeacherOutcome> teachers;
  RunScore ensemble;  // the teachers' weighted average of probabilities: what the student learns
  std::shared_ptr<nn::Module> student;
  RunScore student_score;
  bool cache_targets = false;  // the teachers' targets cached per row (no augmentation, no LM)
  std::int64_t cache_hits = 0, cache_misses = 0;
  // [distill] m_on_m: one student per teacher, and their ensemble's test accuracy.
  std::vector<double> m_on_m_accuracies;
  std::optional<double> m_on_m_accuracy;
  // [distill] baseline: the same student (same seed, same batches) on labels alone.
  std::optional<RunScore> baseline;
  std::optional<Churn> baseline_to_student;
  bool chief = true;  // this process speaks and reports (worker 0 of a multi-worker job)
};

// Refuses (config::ConfigError naming the key) what the run cannot honour: no teachers, a
// backup_dir, a device other than the CPU, hpm train's own settings. A non-finite loss throws
// train::TrainingError. A [noisy_student] section is run_noisy_student's, not this.
DistillationOutcome run_distillation(const config::Config& cfg,
                                     const config::RunLog& log = config::stdout_log());

// The --report of hpm distill.
nlohmann::json distillation_report(const config::Config& cfg, const DistillationOutcome& outcome);

nlohmann::json churn_json(const Churn& churn);

}  // namespace hpm::distill
