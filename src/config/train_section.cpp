// [train], [memory] and [early_stopping]: how long and how a run trains, what it saves, how it
// fits its memory, and when it stops early.
#include <cstdio>
#include <filesystem>

#include "config/reader.h"
#include "config/sections.h"
#include "hpm/autograd/autocast.h"
#include "hpm/io/paths.h"
#include "hpm/nn/containers.h"
#include "hpm/nn/offload.h"
#include "hpm/nn/recompute.h"
#include "hpm/train/callbacks.h"

namespace hpm::config::detail {

void read_train(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table& root = s.root;
  TableReader tr(path, "[train]", section(path, root, "train"));
  tr.get_positive("epochs", c.epochs);
  std::int64_t seed = 0;
  tr.get_non_negative("seed", seed);
  c.seed = static_cast<std::uint64_t>(seed);
  tr.get_positive("threads", c.threads);
  tr.get("label_smoothing", c.label_smoothing);
  if (tr.has("label_smoothing") && !(c.label_smoothing >= 0.0f && c.label_smoothing <= 1.0f))
    tr.out_of_range(*tr.find("label_smoothing"), "label_smoothing", "in [0, 1]");
  tr.get_non_negative("clip_grad_norm", c.clip_grad_norm);  // 0: off
  tr.get("checkpoint_dir", c.checkpoint_dir);
  tr.get_positive("checkpoint_every", c.checkpoint_every);
  tr.get("metrics_csv", c.metrics_csv);
  tr.get("tensorboard_dir", c.tensorboard_dir);
  tr.get("backup_dir", c.backup_dir);
  tr.get("backup_every_steps", c.backup_every_steps);
  tr.get("keep_backup", c.keep_backup);
  if (c.backup_every_steps < 0) {
    throw ConfigError(tr.at("backup_every_steps") +
                      ": [train] backup_every_steps must be 0 (each epoch) or positive, got " +
                      std::to_string(c.backup_every_steps));
  }
  tr.get("best_checkpoint_dir", c.best_checkpoint_dir);
  tr.get("best_checkpoint_monitor", c.best_checkpoint_monitor);  // checked with [early_stopping]
  tr.get_positive("accumulation_steps", c.accumulation_steps);
  tr.get("device", c.device);
  try {
    parse_device_id(c.device);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(tr.at("device") + ": [train] " + e.what());
  }
  tr.get("precision", c.precision);
  try {
    // A GPU multiplies bf16 natively; the CPU may not (checked here, before any work).
    if (autograd::parse_precision(c.precision) == autograd::Precision::BF16 && c.device == "cpu")
      autograd::require_native_bf16();
  } catch (const std::invalid_argument& e) {
    throw ConfigError(tr.at("precision") + ": [train] " + e.what());
  } catch (const std::runtime_error& e) {
    throw ConfigError(tr.at("precision") + ": " + e.what());
  }
  tr.get_positive("max_steps", c.max_steps);
  tr.get_positive("eval_every", c.eval_every);
  tr.get("eval_iters", c.eval_iters);
  if (c.eval_iters < 0) tr.out_of_range(*tr.find("eval_iters"), "eval_iters", "0 (all) or more");
  tr.finish();
  if (c.token_source() && c.max_steps == 0) {
    throw ConfigError(tr.at("max_steps") + ": [train] max_steps is needed with [data] source = \"" +
                      c.source + "\" (a language model trains by steps)");
  }
  if (c.by_steps()) {
    // The Trainer's epochs are the stretches between evaluations, the last one cut short where
    // eval_every does not divide max_steps.
    if (tr.has("epochs")) {
      tr.invalid("epochs",
                 "and max_steps both say how long to train: give one (a --set of "
                 "either replaces the file's other)");
    }
    if (c.eval_every == 0) c.eval_every = c.max_steps;
    c.epochs = (c.max_steps + c.eval_every - 1) / c.eval_every;
  } else if (tr.has("eval_every")) {
    tr.invalid("eval_every", "is for training by steps: set max_steps too");
  }
  if (!c.token_source() && tr.has("eval_iters")) {
    tr.invalid("eval_iters",
               "is for [data] source = \"text\" or \"tokens\" (batches of the "
               "validation split); an image model evaluates on its whole test set");
  }
}

void read_memory(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table& root = s.root;
  TableReader mem(path, "[memory]", section(path, root, "memory"));
  mem.get("recompute", c.recompute);
  mem.get_positive("recompute_every", c.recompute_every);
  mem.get("offload", c.offload);
  mem.get("offload_threshold_kb", c.offload_threshold_kb);
  mem.get_positive("device_budget_mb", c.device_budget_mb);
  // Turned into bytes (a size_t): beyond this the product overflows (1e30 became a 0 budget).
  if (c.device_budget_mb > 1e12)
    mem.out_of_range(*mem.find("device_budget_mb"), "device_budget_mb", "at most 1e12 (MiB)");
  mem.finish();
  try {
    nn::parse_recompute_mode(c.recompute);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(mem.at("recompute") + ": [memory] " + e.what());
  }
  if (!(c.offload_threshold_kb >= 0)) {  // NaN too
    mem.out_of_range(*mem.find("offload_threshold_kb"), "offload_threshold_kb", "0 or more");
  }
  if (c.offload && c.recompute != "never") {
    throw ConfigError(mem.at("offload") + ": [memory] recompute = \"" + c.recompute +
                      "\" and offload = true: choose one (a recomputed segment keeps only its "
                      "input, so there is little left to offload)");
  }
}

// [early_stopping] (present = on), and [train]'s best-epoch checkpoint, which watches a metric
// the same way.
void read_early_stopping(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table& root = s.root;
  const toml::table* es_table = section(path, root, "early_stopping");
  c.early_stopping = es_table != nullptr;
  TableReader es(path, "[early_stopping]", es_table);
  es.get("monitor", c.early_stopping_monitor);
  es.get("mode", c.early_stopping_mode);
  es.get("min_delta", c.early_stopping_min_delta);
  es.get("patience", c.early_stopping_patience);
  es.get("restore_best_weights", c.early_stopping_restore_best_weights);
  es.finish();
  // An error names the key, at its line when the file (not --set) gave it.
  auto at = [&](const toml::table* t, const char* key) {
    const toml::node* n = t ? t->get(key) : nullptr;
    return n ? where(path, *n) : path;
  };
  auto check_monitor = [&](const toml::table* t, const std::string& sec, const char* key,
                           const std::string& monitor, const std::string& mode) {
    if (!train::is_monitor(monitor)) {
      std::string known;
      for (const char* m : train::kMonitors) known += (known.empty() ? "" : ", ") + std::string(m);
      throw ConfigError(at(t, key) + ": " + sec + " " + key + " must be one of " + known +
                        ", got \"" + monitor + "\"");
    }
    try {
      train::resolve_mode(monitor, mode);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(at(t, "mode") + ": " + sec + " " + e.what());
    }
  };
  const toml::table* tr_table = section(path, root, "train");
  check_monitor(tr_table, "[train]", "best_checkpoint_monitor", c.best_checkpoint_monitor, "auto");
  if (c.early_stopping) {
    check_monitor(es_table, "[early_stopping]", "monitor", c.early_stopping_monitor,
                  c.early_stopping_mode);
    if (c.early_stopping_patience < 0) {
      throw ConfigError(at(es_table, "patience") +
                        ": [early_stopping] patience must be a non-negative integer");
    }
    if (!(c.early_stopping_min_delta >= 0)) {
      throw ConfigError(at(es_table, "min_delta") +
                        ": [early_stopping] min_delta must be non-negative");
    }
  }
  // Both save with keep-the-newest pruning and one `latest`, and a finished run deletes its
  // backups: sharing a directory (in any spelling, or one inside the other) would delete each
  // other's checkpoints. Compared as files, not strings.
  const auto overlap = [](const std::string& a, const std::string& b) {
    return !a.empty() && !b.empty() && io::paths_overlap(a, b);
  };
  if (overlap(c.best_checkpoint_dir, c.checkpoint_dir)) {
    throw ConfigError(at(tr_table, "best_checkpoint_dir") + ": [train] best_checkpoint_dir " +
                      c.best_checkpoint_dir + " and checkpoint_dir " + c.checkpoint_dir +
                      " are the same directory or one holds the other: give each its own");
  }
  for (const auto& [key, other] :
       {std::pair<const char*, const std::string*>{"checkpoint_dir", &c.checkpoint_dir},
        {"best_checkpoint_dir", &c.best_checkpoint_dir}}) {
    if (overlap(c.backup_dir, *other)) {
      throw ConfigError(at(tr_table, "backup_dir") + ": [train] backup_dir " + c.backup_dir +
                        " and " + key + " " + *other +
                        " are the same directory or one holds the other: a finished run "
                        "deletes its backups, so give each its own");
    }
  }
}

}  // namespace hpm::config::detail

namespace hpm::config {

std::string tokenizer_id(const data::Tokenizer& tokenizer) {
  if (tokenizer.fingerprint() == 0) return "bytes";
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", tokenizer.fingerprint());
  return std::string("sentencepiece:") + hex;
}

void check_checkpoint_tokenizer(const train::TrainerState& saved, const Config& config,
                                const std::string& where) {
  const auto it = saved.metadata.find("tokenizer");
  if (it == saved.metadata.end() || !config.token_source()) return;
  const std::string mine = tokenizer_id(*config.text_tokenizer);
  if (it->second == mine) return;
  throw ConfigError(where + " was trained with tokenizer " + it->second + ", but " + config.path +
                    " reads text with " + mine +
                    (config.tokenizer.empty() ? " (no [data] tokenizer)"
                                              : " ([data] tokenizer " + config.tokenizer + ")") +
                    ": its ids would stand for other text; give the tokenizer it was trained with");
}

train::FitOptions fit_options(const Config& c) {
  train::FitOptions fo;
  fo.epochs = c.epochs;
  fo.by_steps = c.by_steps();  // epochs of eval_every steps (read_train)
  fo.max_steps = c.max_steps;
  if (c.token_source()) fo.metadata["tokenizer"] = tokenizer_id(*c.text_tokenizer);
  // The checkpoint describes its model: sample, evaluate and export need nothing else.
  fo.description = checkpoint_description(c);
  // A mid-epoch position counts batches of this order of the data.
  fo.input_order = {{"[data] source", c.source},
                    {"[data] files", c.files},
                    {"[data] shuffle", c.shuffle ? "true" : "false"},
                    {"[data] shuffle_buffer", std::to_string(c.shuffle_buffer)},
                    {"[data] train_limit", std::to_string(c.train_limit)},
                    {"[data] drop_remainder", c.drop_remainder ? "true" : "false"}};
  fo.seed = c.seed;
  fo.batch_size = c.batch_size;  // recorded with checkpoints and backups
  fo.label_smoothing = c.label_smoothing;
  fo.clip_grad_norm = c.clip_grad_norm;
  fo.schedule_per_step = c.schedule_unit == "step";
  fo.checkpoint_dir = c.checkpoint_dir;
  fo.checkpoint_every = c.checkpoint_every;
  fo.accumulation_steps = c.accumulation_steps;
  fo.precision = autograd::parse_precision(c.precision);
  return fo;
}

std::shared_ptr<const nn::Objective> build_objective(const Config& c) {
  if (c.model_kind == "gpt")
    return std::make_shared<nn::LanguageModelling>(-100, c.label_smoothing);
  return std::make_shared<nn::Classification>(c.label_smoothing);
}

train::ProgressOptions progress_options(const Config& c) {
  train::ProgressOptions p;
  p.epochs = c.epochs;
  if (c.by_steps()) p.total_steps = c.max_steps;
  if (c.token_source()) p.tokens_per_sample = c.gpt.block_size;
  return p;
}

std::shared_ptr<nn::Module> with_memory_options(const Config& c,
                                                std::shared_ptr<nn::Module> model) {
  const nn::RecomputeMode mode = nn::parse_recompute_mode(c.recompute);
  if (!c.offload && mode == nn::RecomputeMode::Never) return model;
  std::shared_ptr<nn::Sequential> blocks = nn::as_sequential(model);
  std::shared_ptr<nn::Module> runner;
  if (c.offload) {
    nn::OffloadOptions o;
    o.threshold_bytes = static_cast<std::size_t>(c.offload_threshold_kb * 1024.0);
    runner = nn::with_offload(std::move(blocks), o);
  } else {
    runner = nn::with_recomputation(std::move(blocks), c.recompute_every, mode);
  }
  // A Sequential's wrappers keep its names; a model of blocks keeps its own through RunAs.
  if (std::dynamic_pointer_cast<nn::Sequential>(model)) return runner;
  return std::make_shared<nn::RunAs>(std::move(model), std::move(runner));
}

}  // namespace hpm::config
