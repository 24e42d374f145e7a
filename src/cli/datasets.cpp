// The [data] section's training pipeline and evaluation set, shared by the subcommands.
#include "hpm/cli/datasets.h"

#include "hpm/data/in_memory.h"
#include "hpm/io/tfrecord.h"

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

data::Dataset training_pipeline(const Config& cfg, std::int64_t* examples,
                                const dist::Strategy* strategy) {
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
  if (cfg.source == "tfrecord") {
    return limit(
        data::load_tfrecord_examples(cfg.test_files, io::compression_from_name(cfg.compression)),
        cfg.test_limit);
  }
  return limit(data::load_mnist_split(cfg.data_dir, "t10k"), cfg.test_limit);
}

}  // namespace hpm::cli
