// `hpm codistill CONFIG` as one library call: the [codistill] section's K copies of the config's
// model trained together (Anil et al. 2018), as K threads of this process over a local
// communicator group or, under `hpm launch -n K`, one copy per process over gloo: the same code
// through comm::Communicator. Copy r uses seed [train] seed + r (initialization, data order,
// dropout). At the end the copies allgather their test-set logits, and every copy's accuracy and
// the churn between each pair are scored from them.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

#include "hpm/config/config.h"
#include "hpm/config/run_log.h"
#include "hpm/distill/codistill.h"

namespace hpm::distill {

struct CodistillOutcome {
  int copies = 0;
  std::int64_t steps = 0, exchanges = 0;  // copy 0's (every copy takes as many)
  double seconds = 0;                     // copy 0's training
  CopiesScore score;  // from the gathered logits; rows are a language model's positions
  bool chief = true;  // this process speaks and reports (copy 0's, or the only one)
};

// Refuses (config::ConfigError naming the key) what the copies cannot honour: a strategy or
// [pipeline], a [distill] section, [memory] settings, a backup_dir, a launch whose process count
// is not `copies`. A non-finite loss throws train::TrainingError.
CodistillOutcome run_codistillation(const config::Config& cfg,
                                    const config::RunLog& log = config::stdout_log());

// The --report of hpm codistill.
nlohmann::json codistillation_report(const config::Config& cfg, const CodistillOutcome& outcome);

}  // namespace hpm::distill
