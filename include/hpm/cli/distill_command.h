// `hpm distill CONFIG`: trains (or loads) the [distill] section's teachers, distills the config's
// model from them, and with `baseline = true` trains the same student on labels alone.
// With a [noisy_student] section, `hpm distill CONFIG` runs Noisy Student rounds instead.
// `hpm churn CKPT_A CKPT_B CONFIG`: how often two checkpoints of CONFIG's model disagree on the
// test set, split into good churn (A wrong, B right) and bad churn (A right, B wrong).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hpm::cli {

struct DistillCommandOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set: the student's config only
  std::string report;
  int threads = 0;
  std::int64_t seed = -1;
};

struct ChurnCommandOptions {
  std::string checkpoint_a, checkpoint_b, config_path;
  std::vector<std::string> overrides;
  std::string report;
  int threads = 0;
};

// Add the subcommands to `app`; parsing fills the options.
CLI::App* add_distill_command(CLI::App& app, DistillCommandOptions& options);
CLI::App* add_churn_command(CLI::App& app, ChurnCommandOptions& options);

// `hpm codistill CONFIG`: the [codistill] section's copies trained together, as threads of this
// process, or one copy per process under `hpm launch -n K` (gloo).
struct CodistillCommandOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string report;
  int threads = 0;
  std::int64_t seed = -1;
};
CLI::App* add_codistill_command(CLI::App& app, CodistillCommandOptions& options);
int run_codistill(const CodistillCommandOptions& options);

// Exit codes as hpm train: 0 success, 1 bad input (thrown), 3 a non-finite loss.
int run_distill(const DistillCommandOptions& options);
int run_churn(const ChurnCommandOptions& options);

}  // namespace hpm::cli
