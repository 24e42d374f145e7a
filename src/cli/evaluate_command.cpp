#include "hpm/cli/evaluate_command.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>

#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/config/training_run.h"
#include "hpm/train/checkpoint.h"
#include "hpm/train/trainer.h"

namespace hpm::cli {

CLI::App* add_evaluate_command(CLI::App& app, EvaluateCommandOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("evaluate", "evaluate a checkpoint or a weights file on the test set");
  add_common(cmd, o.common, false);
  cmd->add_option("--checkpoint", o.checkpoint, "checkpoint directory");
  cmd->add_option("--weights", o.weights,
                  "a safetensors file of the model's weights (F32, F16, BF16 or F64)");
  return cmd;
}

int run_evaluate(EvaluateCommandOptions o) {
  Common& c = o.common;
  std::string& checkpoint = o.checkpoint;
  std::string& weights = o.weights;
  positional_checkpoint(c.config_path, checkpoint, &weights);
  if (checkpoint.empty() == weights.empty()) {
    throw ConfigError(
        "hpm evaluate: give a checkpoint directory or a .safetensors weights file (one): hpm "
        "evaluate CKPT, or hpm evaluate [CONFIG] --checkpoint DIR | --weights FILE");
  }
  Config cfg = configure(c, checkpoint, weights);
  const std::shared_ptr<nn::Module> model = load_trained_model(cfg, checkpoint, weights);
  auto optimizer = build_optimizer(cfg, *model);
  const data::LabelledData test = test_set(cfg);
  train::Trainer trainer(model, optimizer);
  if (cfg.device != "cpu") trainer.set_device(config_device(cfg));
  // Scored as training scores it: a GPT by next-token loss, token accuracy and perplexity.
  trainer.set_objective(build_objective(cfg));
  const train::EvalResult ev = trainer.evaluate(test);
  const bool text = cfg.token_source();
  if (text) {
    std::printf(
        "val loss %.4f, val perplexity %.2f, val token accuracy %.4f on %lld windows of %lld "
        "tokens\n",
        ev.loss, std::exp(ev.loss), ev.accuracy, static_cast<long long>(ev.samples),
        static_cast<long long>(cfg.gpt.block_size));
  } else {
    std::printf("test accuracy %.4f, test loss %.4f on %lld examples\n", ev.accuracy, ev.loss,
                static_cast<long long>(ev.samples));
  }
  write_report(c.report,
               {{"test_accuracy", ev.accuracy},
                {"test_loss", ev.loss},
                {"examples", ev.samples},
                {"checkpoint", checkpoint},
                {"weights", weights},
                {"val_loss", text ? nlohmann::json(ev.loss) : nlohmann::json()},
                {"val_perplexity", text ? nlohmann::json(std::exp(ev.loss)) : nlohmann::json()}});
  return 0;
}

}  // namespace hpm::cli
