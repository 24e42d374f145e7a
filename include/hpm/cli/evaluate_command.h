// `hpm evaluate CKPT | FILE.safetensors | CONFIG --checkpoint DIR | --weights FILE`: a trained
// model scored on its configuration's test set as training scores it.
#pragma once
#include <string>

#include "hpm/cli/common_flags.h"

namespace CLI {
class App;
}

namespace hpm::cli {

struct EvaluateCommandOptions {
  Common common;
  std::string checkpoint, weights;
};

CLI::App* add_evaluate_command(CLI::App& app, EvaluateCommandOptions& options);
int run_evaluate(EvaluateCommandOptions options);

}  // namespace hpm::cli
