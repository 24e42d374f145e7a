// `hpm distill CONFIG` with a [noisy_student] section, as one library call: the [data] dir's
// training rows split into labelled and unlabelled ones, a first teacher trained on the labelled
// rows under the section's noise, then Noisy Student rounds (Xie et al. 2020): each round's
// student learns from the labelled rows and the teacher's pseudo-labels, and teaches the next.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "hpm/config/config.h"
#include "hpm/config/run_log.h"
#include "hpm/distill/noisy_student.h"

namespace hpm::distill {

struct NoisyStudentOutcome {
  std::int64_t labelled = 0, unlabelled = 0;
  std::int64_t teacher_epochs = 0;
  std::shared_ptr<nn::Module> teacher;  // round 0's, trained on the labelled rows alone
  double teacher_accuracy = 0;          // on the test set
  std::vector<NoisyStudentRound> rounds;
};

// Refuses (config::ConfigError naming the key) what the rounds cannot honour: a strategy, a
// source other than IDX files, the Trainer's settings that distill::fit_targets does not apply.
NoisyStudentOutcome run_noisy_student(const config::Config& cfg,
                                      const config::RunLog& log = config::stdout_log());

// The --report of hpm distill with [noisy_student].
nlohmann::json noisy_student_report(const config::Config& cfg, const NoisyStudentOutcome& outcome);

}  // namespace hpm::distill
