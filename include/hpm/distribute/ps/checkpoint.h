// Parameter-server checkpoints on disk: `<checkpoint_dir>/ckpt-<next task>/` holding
// manifest.json (the next task, the tasks to redo, the mode, and per shard its file, CRC32C and
// version) and one shard-<task>.safetensors per parameter-server task (its variables, and its
// optimizer state under "optimizer/"); `<checkpoint_dir>/latest` names the newest.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hpm/nn/module.h"
#include "hpm/tensor/tensor.h"

namespace hpm::distribute::ps {

struct PsCheckpoint {
  std::string dir;
  std::map<std::string, Tensor> variables;  // by server variable name (buffers under "buffers/")
  nn::NamedTensors optimizer_state;         // "step" first
  std::vector<std::int64_t> versions;       // per shard
  std::int64_t next_task = 0;
  std::vector<std::int64_t> redo;
  // How the job that wrote it counted its work: "sync" or "async", the parts of a step (a sync
  // job's workers; 1 async) and the tasks of an epoch. Its shards' versions count steps of those
  // parts, so a job continuing with others would take its pushes for duplicates (empty and 0 in
  // checkpoints from before they were recorded).
  std::string mode;
  std::int64_t parts = 0, tasks_per_epoch = 0;
  // What the job recorded to describe itself (CoordinatorOptions::metadata: the CLI's resolved
  // configuration and tokenizer), as a Trainer's checkpoint does.
  std::map<std::string, std::string> metadata;
};

// The ckpt-* directory of the parameter-server checkpoint at `path` (a checkpoint_dir, following
// its `latest`, or one ckpt-* directory); empty when there is none (no manifest.json there).
std::string ps_checkpoint_dir(const std::string& path);

// Reads every shard of the checkpoint in `dir`, each checked against the manifest's CRC32C.
// PsError naming the file when one is missing, unreadable or corrupt.
PsCheckpoint read_ps_checkpoint(const std::string& dir);

// The manifest's metadata alone (no shard is read); PsError when the manifest is unreadable.
std::map<std::string, std::string> read_ps_checkpoint_metadata(const std::string& dir);

// The model's weights in a parameter-server checkpoint, by the model's own names: its parameters
// and float buffers (the servers keep buffers as "buffers/<name>"; integer ones, such as
// BatchNorm's num_batches_tracked, stay with the workers and are not in it).
nn::NamedTensors ps_checkpoint_weights(const PsCheckpoint& checkpoint);

// Deletes one checkpoint directory's files by name (manifest.json, shard-*.safetensors and their
// temporaries), then the directory if that empties it.
void remove_ps_checkpoint(const std::string& dir);

}  // namespace hpm::distribute::ps
