// [strategy] and [pipeline]: how the training is spread over replicas, processes or stages.
#include <set>

#include "config/reader.h"
#include "config/sections.h"
#include "hpm/comm/communicator.h"
#include "hpm/pipeline/partition.h"
#include "hpm/pipeline/schedule.h"

namespace hpm::config::detail {

void read_strategy(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table& root = s.root;
  TableReader st(path, "[strategy]", section(path, root, "strategy"));
  st.get("kind", c.strategy);
  st.get_positive("replicas", c.replicas);
  st.get("bucket_mb", c.bucket_mb);
  st.get("overlap", c.overlap);
  st.get("allreduce_dtype", c.allreduce_dtype);
  st.get("algorithm", c.algorithm);
  st.get_positive("timeout_s", c.timeout_s);
  st.get("timeline", c.timeline);
  st.get("shard", c.shard);
  st.finish();
  if (c.shard != "batch" && c.shard != "elements" && c.shard != "files") {
    throw ConfigError(st.at("shard") +
                      ": [strategy] shard must be \"batch\", \"elements\" or \"files\", got \"" +
                      c.shard + "\"");
  }
  if (c.shard == "files" && c.source != "tfrecord") {
    throw ConfigError(st.at("shard") +
                      ": [strategy] shard = \"files\" needs [data] source = \"tfrecord\"");
  }
  static const std::set<std::string> kinds = {"one_device", "mirrored", "multi_worker_mirrored",
                                              "central_storage"};
  if (!kinds.count(c.strategy)) {
    throw ConfigError(st.at("kind") +
                      ": [strategy] kind must be one_device, mirrored, multi_worker_mirrored or "
                      "central_storage, got \"" +
                      c.strategy + "\"");
  }
  // Each worker builds the same pipeline and keeps its share of its order; an order that differs
  // between processes (parallel maps in completion order) trained some examples twice an epoch
  // and others never, without a word.
  if (c.strategy == "multi_worker_mirrored" && !c.deterministic && c.shard != "files") {
    throw ConfigError(st.at("kind") + ": [strategy] multi_worker_mirrored with shard = \"" +
                      c.shard +
                      "\" needs [data] deterministic = true: every worker must see one order to "
                      "take its share of it (or shard = \"files\", each worker reading its own)");
  }
  if (c.allreduce_dtype != "f32" && c.allreduce_dtype != "bf16") {
    throw ConfigError(st.at("allreduce_dtype") +
                      ": [strategy] allreduce_dtype must be \"f32\" or \"bf16\", got \"" +
                      c.allreduce_dtype + "\"");
  }
  if (!(c.bucket_mb > 0 && c.bucket_mb <= 1e6))
    st.out_of_range(*st.find("bucket_mb"), "bucket_mb", "positive and at most 1e6 (MiB)");
  try {
    comm::algorithm_from_name(c.algorithm);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(st.at("algorithm") + ": [strategy] algorithm: " + e.what());
  }
  if (c.strategy == "one_device" && c.replicas != 1) {
    throw ConfigError(st.at("replicas") +
                      ": [strategy] one_device has exactly one replica, got replicas = " +
                      std::to_string(c.replicas));
  }
}

void read_pipeline(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table* t = section(path, s.root, "pipeline");
  PipelineSection& p = c.pipeline;
  p.present = t != nullptr;
  TableReader r(path, "[pipeline]", t);
  r.get_positive("stages", p.stages);
  r.get_positive("micro_batches", p.micro_batches);
  r.get("schedule", p.schedule);
  r.get_positive("chunks_per_stage", p.chunks_per_stage);
  r.get("partition", p.partition);
  r.get_positive("profile_repeats", p.profile_repeats);
  r.finish();
  if (!p.present) return;
  auto at = [&](const char* key) {
    const toml::node* n = t->get(key);
    return n ? where(path, *n) : path;
  };
  try {
    pipeline::partition_from_name(p.partition);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(at("partition") + ": [pipeline] " + e.what());
  }
  try {
    pipeline::make_schedule(pipeline::schedule_from_name(p.schedule), p.stages, p.micro_batches,
                            p.chunks_per_stage);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(at("schedule") + ": [pipeline] " + e.what());
  }
  if (c.accumulation_steps != 1) {
    throw ConfigError(path + ": [pipeline] splits every batch into micro_batches already; " +
                      "[train] accumulation_steps must stay 1");
  }
  if (c.offload) {
    throw ConfigError(path + ": [memory] offload is for one device; a [pipeline] lowers each " +
                      "stage's memory with recompute instead");
  }
  if (c.strategy != "one_device") {
    throw ConfigError(path + ": [pipeline] runs on its own stages; it does not combine with " +
                      "[strategy] kind = \"" + c.strategy + "\"");
  }
  if (c.batch_size < p.micro_batches) {
    throw ConfigError(at("micro_batches") + ": [pipeline] micro_batches (" +
                      std::to_string(p.micro_batches) + ") exceeds [data] batch_size (" +
                      std::to_string(c.batch_size) + ")");
  }
}

}  // namespace hpm::config::detail
