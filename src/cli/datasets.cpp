// The [data] section's training pipeline and evaluation set, shared by the subcommands.
#include "hpm/cli/datasets.h"

#include "hpm/data/in_memory.h"
#include "hpm/data/text_corpus.h"
#include "hpm/io/tfrecord.h"
#include "hpm/tensor/kernels.h"

namespace hpm::cli {

namespace {
data::LabelledData limit(data::LabelledData d, std::int64_t n) {
  if (n > 0 && n < d.size()) {
    d.inputs = d.inputs.narrow(0, n);
    d.labels = d.labels.narrow(0, n);
  }
  return d;
}
}  // namespace

data::TextCorpus text_corpus(const Config& cfg) {
  data::TextCorpus c = data::load_text_corpus(cfg.files);
  if (c.vocab_size > cfg.gpt.vocab_size) {
    throw ConfigError(cfg.path + ": [model] vocab_size " + std::to_string(cfg.gpt.vocab_size) +
                      " is smaller than the byte-level corpus' vocabulary (" +
                      std::to_string(c.vocab_size) + " tokens) of " + cfg.files);
  }
  return c;
}

data::Dataset training_pipeline(const Config& cfg, std::int64_t* examples,
                                const dist::Strategy* strategy) {
  if (cfg.source == "text") {
    // Every worker draws the same global batches (the seed is the run's) and trains on its rows.
    const data::TextCorpus c = text_corpus(cfg);
    *examples = cfg.eval_every * cfg.batch_size;  // windows per stretch between evaluations
    return data::random_windows(c.train, cfg.gpt.block_size, cfg.batch_size, cfg.seed,
                                cfg.eval_every);
  }
  data::PipelineSpec spec = pipeline_spec(cfg);
  if (strategy != nullptr && strategy->num_workers() > 1 && cfg.shard != "batch") {
    spec.num_shards = strategy->num_workers();
    spec.shard_index = strategy->worker_rank();
    spec.shard_files = cfg.shard == "files";
    spec.batch_size = cfg.batch_size / strategy->num_workers();
  }
  if (cfg.source == "tfrecord") {
    *examples = -1;
    return data::build_tfrecord_pipeline(cfg.files, io::compression_from_name(cfg.compression),
                                         spec);
  }
  const data::LabelledData train =
      limit(data::load_mnist_split(cfg.data_dir, "train"), cfg.train_limit);
  *examples = train.size();
  return data::build_pipeline(train, spec);
}

data::LabelledData test_set(const Config& cfg) {
  if (cfg.source == "text") {
    // The validation split's sweep, eval_iters batches of it (all of it for 0).
    const data::TextCorpus c = text_corpus(cfg);
    auto it = data::sequential_windows(c.val, cfg.gpt.block_size, cfg.batch_size).make_iterator();
    std::vector<Tensor> inputs, targets;
    data::Element e;
    while ((cfg.eval_iters == 0 || static_cast<std::int64_t>(inputs.size()) < cfg.eval_iters) &&
           it->next(e)) {
      inputs.push_back(e[0]);
      targets.push_back(e[1]);
    }
    return {kernels::concat(inputs, 0), kernels::concat(targets, 0)};
  }
  if (cfg.source == "tfrecord") {
    return limit(
        data::load_tfrecord_examples(cfg.test_files, io::compression_from_name(cfg.compression)),
        cfg.test_limit);
  }
  return limit(data::load_mnist_split(cfg.data_dir, "t10k"), cfg.test_limit);
}

}  // namespace hpm::cli
