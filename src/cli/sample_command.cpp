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
#include "hpm/tensor/device.h"
#include "hpm/tensor/random.h"
#include "hpm/train/checkpoint.h"

namespace hpm::cli {

namespace {

// A token from logits (V): temperature, the top_k largest (0: all), then a draw.
std::int64_t draw(const Tensor& logits, float temperature, std::int64_t top_k, Generator& gen) {
  std::vector<float> z = logits.to_vector();
  if (top_k > 0 && top_k < static_cast<std::int64_t>(z.size())) {
    std::vector<float> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
    const float kth = sorted[static_cast<std::size_t>(top_k - 1)];
    for (float& v : z)
      if (v < kth) v = -INFINITY;
  }
  const float mx = *std::max_element(z.begin(), z.end());
  double total = 0;
  for (float& v : z) total += v = std::exp((v - mx) / temperature);
  double u = static_cast<double>(gen.uniform()) * total;
  for (std::size_t i = 0; i < z.size(); ++i) {
    u -= z[i];
    if (u <= 0) return static_cast<std::int64_t>(i);
  }
  return static_cast<std::int64_t>(z.size() - 1);
}

Tensor row(const std::vector<std::int64_t>& tokens) {
  return Tensor::from_i64(tokens, Shape{1, static_cast<std::int64_t>(tokens.size())});
}

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

// Decoded text as the tokens arrive: what is new since the last call. A character whose bytes
// are not all drawn yet decodes as U+FFFD; it is held back until it is whole (or the end).
class TextStream {
 public:
  explicit TextStream(const data::Tokenizer& tok) : tok_(tok) {}
  std::string add(std::int64_t id) {
    ids_.push_back(id);
    std::string text = tok_.decode(ids_);
    static const std::string kReplacement = "\xEF\xBF\xBD";
    while (text.size() >= kReplacement.size() &&
           text.compare(text.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
      text.resize(text.size() - kReplacement.size());
    return advance(text);
  }
  std::string finish() { return advance(tok_.decode(ids_)); }
  const std::vector<std::int64_t>& ids() const { return ids_; }

 private:
  std::string advance(const std::string& text) {
    if (text.size() <= shown_.size() || text.compare(0, shown_.size(), shown_) != 0) return "";
    std::string fresh = text.substr(shown_.size());
    shown_ = text;
    return fresh;
  }
  const data::Tokenizer& tok_;
  std::vector<std::int64_t> ids_;
  std::string shown_;
};

}  // namespace

CLI::App* add_sample_command(CLI::App& app, SampleCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand("sample", "text from a trained GPT, printed as it is drawn");
  cmd->add_option("config", o.config_path,
                  "a checkpoint directory (hpm sample CKPT), or the TOML config the model was "
                  "trained with (default: the one the checkpoint recorded)");
  cmd->add_option("--set", o.overrides, "override a config value: section.key=value (repeatable)");
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
  model.eval();
  // On a GPU: the weights move there, and every tensor of the drawing (the key/value cache, the
  // logits) is made there; only each token's logits come back to the host to be drawn from.
  Device& device = config_device(cfg);
  model.move_to(device);
  DeviceGuard on(device);
  const std::int64_t vocab = cfg.gpt.vocab_size, block = cfg.gpt.block_size;
  const data::Tokenizer& tok = tokenizer_of(cfg);
  std::vector<std::int64_t> tokens = prompt_ids(o.prompt, tok, vocab);
  if (static_cast<std::int64_t>(tokens.size()) > block) {
    tokens.erase(tokens.begin(), tokens.end() - block);  // the model sees block_size tokens
  }
  Generator gen(static_cast<std::uint64_t>(o.seed));
  TextStream stream(tok);
  const auto t0 = std::chrono::steady_clock::now();
  nn::KVCache cache;
  Tensor logits = o.no_cache ? Tensor() : model.decode(row(tokens), cache);
  for (std::int64_t n = 0; n < o.tokens; ++n) {
    if (o.no_cache) {
      NoGradGuard no_grad;
      const std::int64_t t = static_cast<std::int64_t>(tokens.size());
      const Tensor all = model.forward(row(tokens));
      logits = all.reshape({t, vocab}).narrow(t - 1, 1).reshape({vocab});
    }
    // Only ids the tokenizer has: a model may be wider than its tokenizer (a byte model with a
    // vocab_size above 256, as nanoGPT pads it), and its extra rows are never a text's token.
    const std::int64_t usable = std::min(vocab, tok.vocab_size());
    const std::int64_t next =
        draw(usable < vocab ? logits.narrow(0, usable) : logits, o.temperature, o.top_k, gen);
    const std::string fresh = stream.add(next);
    std::fwrite(fresh.data(), 1, fresh.size(), stdout);
    std::fflush(stdout);
    tokens.push_back(next);
    if (static_cast<std::int64_t>(tokens.size()) > block) tokens.erase(tokens.begin());
    if (n + 1 == o.tokens || o.no_cache) continue;
    if (cache.length >= block) {
      // Positions are absolute (learned embeddings): once the window is full, a token's keys and
      // values depend on where the window starts, so the cache cannot slide. The window is run
      // again (as --no-cache does; the same block_size tokens, the same text), and the cache
      // saves work only while the window fills.
      cache = nn::KVCache{};
      const std::vector<std::int64_t> keep(tokens.end() - block, tokens.end() - 1);
      if (!keep.empty()) model.decode(row(keep), cache);
      logits = model.decode(row({tokens.back()}), cache);
    } else {
      logits = model.decode(row({next}), cache);
    }
  }
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
