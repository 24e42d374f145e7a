#include "hpm/cli/sample_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hpm/autograd/grad_mode.h"
#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/data/token_shard.h"
#include "hpm/data/tokenizer.h"
#include "hpm/io/atomic_file.h"
#include "hpm/nn/gpt.h"
#include "hpm/nn/sampling.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/random.h"
#include "hpm/train/checkpoint.h"

namespace hpm::cli {

namespace {

// The tokenizer the model was trained with: [data] tokenizer, else bytes; for shards, the one
// their header names must be it (else the ids would be read with the wrong vocabulary).
const data::Tokenizer& tokenizer_of(const Config& cfg) {
  if (cfg.source == "tokens") {
    const std::string first = data::token_shard_files(cfg.files).front();
    const data::TokenShardHeader h = data::read_token_shard_header(first);
    if (h.tokenizer != cfg.text_tokenizer->fingerprint()) {
      throw ConfigError(first + ": byte 36: the shards were encoded by another tokenizer than " +
                        (cfg.tokenizer.empty() ? std::string("bytes") : cfg.tokenizer) +
                        ": name theirs as [data] tokenizer (" + cfg.path + ")");
    }
  }
  return *cfg.text_tokenizer;
}

// The prompt's ids: refused when the tokenizer cannot encode it, or when an id is past the
// model's vocabulary (byte tokens with a [model] vocab_size below 256).
std::vector<std::int64_t> prompt_ids(const std::string& prompt, const data::Tokenizer& tok,
                                     std::int64_t vocab) {
  std::vector<std::int64_t> ids = tok.encode(prompt.empty() ? "\n" : prompt, "--prompt");
  if (ids.empty()) throw ConfigError("--prompt: \"" + prompt + "\" encodes to no token");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab) {
      throw ConfigError("--prompt: token " + std::to_string(ids[i]) + " (position " +
                        std::to_string(i) + ", from " + tok.name() +
                        ") is outside the model's vocabulary of " + std::to_string(vocab) +
                        " ([model] vocab_size)");
    }
  }
  return ids;
}

}  // namespace

CLI::App* add_sample_command(CLI::App& app, SampleCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand("sample", "text from a trained GPT, printed as it is drawn");
  add_config_flags(cmd, o.config_path, o.overrides,
                   "a checkpoint directory (hpm sample CKPT), or the TOML config the model was "
                   "trained with (default: the one the checkpoint recorded)",
                   nullptr, /*optional=*/true);
  cmd->add_option("--checkpoint", o.checkpoint, "checkpoint directory");
  cmd->add_option("--prompt", o.prompt, "text to continue (default: a newline)");
  cmd->add_option("--tokens", o.tokens, "tokens to draw (200)")->check(positive_number());
  cmd->add_option("--temperature", o.temperature, "softmax temperature (0.8)")
      ->check(positive_number());
  cmd->add_option("--top-k", o.top_k, "draw among the k likeliest tokens (0: all)")
      ->check(non_negative_number());
  cmd->add_option("--seed", o.seed, "random seed (0)")->check(seed_range());
  cmd->add_option("--threads", o.threads, "kernel threads (1)")->check(CLI::Range(1, 1024));
  cmd->add_option("--device", o.device,
                  "where to run: cpu, cuda or cuda:N (overrides [train] device)");
  cmd->add_flag("--no-cache", o.no_cache, "re-run the window for each token (for comparison)");
  cmd->add_option("--report", o.report, "write tokens/s and the text as JSON");
  return cmd;
}

int run_sample(SampleCommandOptions o) {
  positional_checkpoint(o.config_path, o.checkpoint);
  if (o.checkpoint.empty()) {
    throw ConfigError(
        "hpm sample: give the checkpoint to draw from: hpm sample CKPT [--prompt "
        "TEXT], or hpm sample CONFIG --checkpoint CKPT");
  }
  // The logits are divided by it: a value that is 0 or infinite as a float would draw NaNs.
  if (!(o.temperature > 0.0f) || !std::isfinite(o.temperature))
    throw ConfigError("--temperature: too small or too large for a 32-bit float");
  std::vector<std::string> overrides = o.overrides;
  if (!o.device.empty()) overrides.push_back("train.device=" + o.device);
  const Config cfg = config_for_checkpoint(o.config_path, o.checkpoint, overrides);
  if (cfg.model_kind != "gpt") {
    throw ConfigError(cfg.path + ": hpm sample draws from a [model] kind = \"gpt\", this is \"" +
                      cfg.model_kind + "\"");
  }
  use_threads(o.threads);
  nn::GPT model(cfg.gpt);
  check_checkpoint_tokenizer(train::load_checkpoint(o.checkpoint, model, nullptr), cfg,
                             "the checkpoint " + o.checkpoint);
  model.move_to(config_device(cfg));  // on a GPU, the drawing happens there (nn::sample)
  const data::Tokenizer& tok = tokenizer_of(cfg);
  nn::SampleOptions so;
  so.tokens = o.tokens;
  so.temperature = o.temperature;
  so.top_k = o.top_k;
  so.seed = static_cast<std::uint64_t>(o.seed);
  so.usable_vocab = tok.vocab_size();
  so.no_cache = o.no_cache;
  data::IncrementalDecoder stream(tok);
  const auto t0 = std::chrono::steady_clock::now();
  nn::sample(model, prompt_ids(o.prompt, tok, cfg.gpt.vocab_size), so, [&](std::int64_t id) {
    const std::string fresh = stream.add(id);
    std::fwrite(fresh.data(), 1, fresh.size(), stdout);
    std::fflush(stdout);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string rest = stream.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::printf("\n");
  // The text is done before the status goes to stderr: on a terminal both share the screen, and
  // the status must not land inside the text.
  std::fflush(stdout);
  const std::string text = tok.decode(stream.ids());
  std::fprintf(stderr, "%lld tokens in %.2f s: %.0f tokens/s (%s)\n",
               static_cast<long long>(o.tokens), seconds, static_cast<double>(o.tokens) / seconds,
               o.no_cache ? "re-running the window" : "key/value cache");
  write_report(o.report, {{"tokens", o.tokens},
                          {"seconds", seconds},
                          {"tokens_per_s", o.tokens / seconds},
                          {"cache", !o.no_cache},
                          {"text", text}});  // not UTF-8 from a byte model: U+FFFD (report.h)
  return 0;
}

}  // namespace hpm::cli
