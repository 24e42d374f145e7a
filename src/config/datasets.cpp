// The [data] section's training pipeline and evaluation set, shared by the subcommands.
#include "hpm/config/datasets.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

#include "hpm/data/file_sources.h"
#include "hpm/data/in_memory.h"
#include "hpm/data/input_pipeline.h"
#include "hpm/data/text_corpus.h"
#include "hpm/data/token_shard.h"
#include "hpm/io/tfrecord.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::config {

namespace {

struct LanguageModelTokens {
  data::TokenSequence train, val;
};

// [data] source = "random_tokens": uniform ids in [0, vocab_size), the training split from the
// run's seed, the validation split from another stream of it. The training split holds 64
// batches' windows (at least 2^20 tokens), so windows drawn at random starts overlap no more than
// a corpus' would; the validation split eval_iters batches (16 when 0, the whole sweep).
LanguageModelTokens random_language_model_tokens(const Config& cfg) {
  const std::int64_t window = cfg.gpt.block_size + 1, batch = cfg.batch_size;
  const std::int64_t n_train = std::max<std::int64_t>(std::int64_t{1} << 20, 64 * batch * window);
  const std::int64_t n_val = (cfg.eval_iters > 0 ? cfg.eval_iters : 16) * batch * window + 1;
  const auto draw = [&](std::int64_t n, std::uint64_t seed) {
    Generator gen(seed);
    std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
    const auto vocab = static_cast<std::uint64_t>(cfg.gpt.vocab_size);
    for (auto& id : ids) id = static_cast<std::int64_t>(gen.below(vocab));
    return data::TokenSequence(Tensor::from_i64(ids, {n}, Device::cpu()));
  };
  return {draw(n_train, cfg.seed), draw(n_val, cfg.seed ^ 0x5eed0fa11da7a5e7ull)};
}

// [data] source = "text" (the files encoded by the config's tokenizer, bytes by default) or
// "tokens" (mapped shards, whose vocabulary and tokenizer must be the config's).
LanguageModelTokens load_language_model_tokens(const Config& cfg) {
  const data::Tokenizer& tok = *cfg.text_tokenizer;
  if (cfg.source == "random_tokens") return random_language_model_tokens(cfg);
  if (cfg.source == "text") {
    data::TextCorpus c = data::load_text_corpus(cfg.files, tok);
    if (c.vocab_size > cfg.gpt.vocab_size) {  // bytes; a SentencePiece model's is checked equal
      throw ConfigError(cfg.path + ": [model] vocab_size " + std::to_string(cfg.gpt.vocab_size) +
                        " is smaller than the byte-level corpus' vocabulary (" +
                        std::to_string(c.vocab_size) + " tokens) of " + cfg.files);
    }
    return {c.train, c.val};
  }
  data::TokenCorpus c = data::load_token_shards(cfg.files, cfg.test_files);
  const std::string& first = c.train_files.front();
  if (c.vocab_size != cfg.gpt.vocab_size) {
    throw ConfigError(first + ": byte 16: the shard's vocabulary is " +
                      std::to_string(c.vocab_size) + " tokens, but [model] vocab_size is " +
                      std::to_string(cfg.gpt.vocab_size) + " (" + cfg.path + ")");
  }
  if (c.tokenizer != tok.fingerprint()) {
    char made[16], ours[16];
    std::snprintf(made, sizeof made, "0x%08x", c.tokenizer);
    std::snprintf(ours, sizeof ours, "0x%08x", tok.fingerprint());
    throw ConfigError(first + ": byte 36: encoded by the tokenizer of fingerprint " + made +
                      ", but [data] tokenizer " +
                      (cfg.tokenizer.empty() ? std::string("(bytes)") : cfg.tokenizer) + " is " +
                      ours + " (" + cfg.path + ")");
  }
  return {c.train, c.val};
}

// The training pipeline and the validation set read the same tokens: encoded (or mapped and
// verified) once per process and configuration.
LanguageModelTokens language_model_tokens(const Config& cfg) {
  static std::mutex mu;
  static std::map<std::vector<std::string>, LanguageModelTokens> loaded;
  std::vector<std::string> key = {cfg.source, cfg.files, cfg.test_files, cfg.tokenizer,
                                  std::to_string(cfg.gpt.vocab_size)};
  if (cfg.source == "random_tokens") {  // drawn from the seed, sized by the windows
    for (const std::int64_t v :
         {static_cast<std::int64_t>(cfg.seed), cfg.gpt.block_size, cfg.batch_size, cfg.eval_iters})
      key.push_back(std::to_string(v));
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find(key);
  if (it == loaded.end()) {
    LanguageModelTokens t = load_language_model_tokens(cfg);
    // Said here, naming the key and the file, rather than by the window sampler deep inside.
    for (const auto& [split, tokens, files] :
         {std::tuple{"training", &t.train, &cfg.files},
          std::tuple{"validation", &t.val,
                     cfg.test_files.empty() ? &cfg.files : &cfg.test_files}}) {
      if (tokens->size() >= cfg.gpt.block_size + 2) continue;
      refuse_setting(cfg, "model", "block_size",
                     "= " + std::to_string(cfg.gpt.block_size) + " is too long for the " + split +
                         " text of " + *files + ": it holds " + std::to_string(tokens->size()) +
                         " tokens, and a window needs block_size + 2; give a smaller block_size "
                         "or more text");
    }
    it = loaded.emplace(key, std::move(t)).first;
  }
  return it->second;
}

}  // namespace

data::Dataset in_stretches(const Config& cfg, data::Dataset epochs) {
  return cfg.by_steps() ? epochs.stretches(cfg.eval_every) : epochs;
}

data::Dataset training_pipeline(const Config& cfg, std::int64_t* examples,
                                const distribute::Strategy* strategy) {
  if (cfg.token_source()) {
    // Every worker draws the same global batches (the seed is the run's) and trains on its rows.
    const LanguageModelTokens t = language_model_tokens(cfg);
    *examples = cfg.eval_every * cfg.batch_size;  // windows per stretch between evaluations
    return data::random_windows(t.train, cfg.gpt.block_size, cfg.batch_size, cfg.seed,
                                cfg.eval_every);
  }
  data::InputPipelineSpec spec = pipeline_spec(cfg);
  if (strategy != nullptr && strategy->num_workers() > 1 && cfg.shard != "batch") {
    spec.num_shards = strategy->num_workers();
    spec.shard_index = strategy->worker_rank();
    spec.shard_files = cfg.shard == "files";
    spec.batch_size = cfg.batch_size / strategy->num_workers();
  }
  if (cfg.source == "tfrecord") {
    // Counted first: the banner and the progress know the size, and an empty set is refused.
    const io::Compression compression = io::compression_from_name(cfg.compression);
    const std::int64_t records = data::count_tfrecords(cfg.files, compression);
    *examples = cfg.train_limit > 0 ? std::min(records, cfg.train_limit) : records;
    if (*examples == 0) {
      throw ConfigError(cfg.path + ": [data] files = \"" + cfg.files +
                        "\": no training example (the files hold no record)");
    }
    spec.limit = cfg.train_limit;
    return in_stretches(cfg, data::build_tfrecord_input_pipeline(cfg.files, compression, spec));
  }
  const data::LabelledData train =
      data::load_mnist_split(cfg.data_dir, "train").first(cfg.train_limit);
  *examples = train.size();
  return in_stretches(cfg, data::build_input_pipeline(train, spec));
}

data::TokenSequence training_tokens(const Config& cfg) { return language_model_tokens(cfg).train; }

namespace {
// A record file in both globs made the test figures those of training data, reported as held out.
void refuse_files_in_both_splits(const Config& cfg) {
  const std::string f =
      data::first_shared_file(data::glob_paths(cfg.files), data::glob_paths(cfg.test_files));
  if (f.empty()) return;
  throw ConfigError(cfg.path + ": [data] files (\"" + cfg.files + "\") and test_files (\"" +
                    cfg.test_files + "\") both match " + f +
                    ": the test set must be held out of training");
}
}  // namespace

data::LabelledData test_set(const Config& cfg) {
  if (cfg.token_source()) {
    // The validation split's sweep, eval_iters batches of it (all of it for 0).
    return data::validation_windows(language_model_tokens(cfg).val, cfg.gpt.block_size,
                                    cfg.batch_size, cfg.eval_iters);
  }
  if (cfg.source == "tfrecord") refuse_files_in_both_splits(cfg);
  data::LabelledData test =
      cfg.source == "tfrecord"
          ? data::load_tfrecord_examples(cfg.test_files, io::compression_from_name(cfg.compression))
                .first(cfg.test_limit)
          : data::load_mnist_split(cfg.data_dir, "t10k").first(cfg.test_limit);
  // Evaluated as trained: a model that learnt normalized (or resized) images is measured on them.
  test.inputs = data::evaluation_transform(test.inputs, cfg.augment);
  return test;
}

}  // namespace hpm::config
