// Checkpoints: a directory per save, `<root>/ckpt-<global step>/` holding model.safetensors,
// optimizer.safetensors, iterator.bin (the input pipeline's state, when saved mid-epoch) and
// trainer_state.json (epoch, step, RNG, and the CRC32C of each other file). Every file is written
// to a temporary name, fsynced and renamed; the trainer state goes last and `<root>/latest` is
// switched only after it, so a crash mid-save leaves the previous checkpoint as the latest. Loading
// verifies the checksums.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hpm/io/safetensors.h"
#include "hpm/nn/module.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/random.h"

namespace hpm::train {

struct TrainerState {
  std::int64_t epoch = 0;          // the epoch in progress (or next to run)
  std::int64_t step_in_epoch = 0;  // batches of `epoch` already trained
  std::int64_t global_step = 0;
  std::uint64_t seed = 0;
  std::int64_t batch_size = 0;  // of the input whose batches step_in_epoch counts (0: unknown)
  Generator::State rng;         // the default generator (dropout, init)
  // A strategy's replicas' own generators (dropout on replica threads), by global replica index;
  // empty without a strategy or in checkpoints from before they were saved.
  std::vector<Generator::State> replica_rngs;
  // What callbacks carry across a restart (Callback::save_state's tensors: EarlyStopping's best
  // weights), saved as the checkpoint's callbacks.safetensors; empty: none. Their scalars go in
  // `metadata`.
  nn::NamedTensors callback_tensors;
  std::string
      iterator_state;  // the input pipeline's Iterator state mid-epoch (empty at a boundary)
  // What the run trained on, as its caller records it (the CLI: the tokenizer), saved beside the
  // weights so that whoever reads them can check they mean the same (FitOptions::metadata).
  std::map<std::string, std::string> metadata;
};

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Returns the directory written, root/ckpt-<global step>. Keeps the newest `keep` checkpoints under
// root of steps up to this one (later ones are another history's, never deleted). One of the same
// step already there is replaced whole or not at all (written beside it, then swapped in); files
// someone else put in it stay. Throws CheckpointError (or io::IoError) naming the file; what was
// saved before stays readable.
std::string save_checkpoint(const std::string& root, const nn::Module& model,
                            const optim::Optimizer& optimizer, const TrainerState& state,
                            int keep = 2);

// `path` is a checkpoint root (follows `latest`) or one ckpt-* directory. The model and optimizer
// are touched only after every file is present and its checksum matches. Without an optimizer
// (evaluation, teachers) optimizer.safetensors is not needed. The model's weights may be F16,
// BF16 or F64 (cast to f32).
TrainerState load_checkpoint(const std::string& path, nn::Module& model,
                             optim::Optimizer* optimizer);

// The state of the checkpoint at `path` (a root or a ckpt-* directory) without its weights: what
// a caller reads before it can build the model (the configuration recorded in its metadata).
TrainerState read_checkpoint_state(const std::string& path);

// Whether `name` is one save_checkpoint gives a directory: "ckpt-" and the global step.
bool is_checkpoint_name(const std::string& name);

// Whether `root` holds checkpoints: a `latest` file or a ckpt-<N> directory.
bool holds_checkpoints(const std::string& root);
// The metadata key a checkpoint's kind is saved under, and the kind of the Trainer's backups
// (FitOptions::backup_dir); other checkpoints have none.
inline constexpr const char* kCheckpointKind = "checkpoint_kind";
inline constexpr const char* kBackup = "backup";
// The ckpt-<N> directories under `root` whose trainer_state.json reads and does not record `kind`
// (ones that do not read are not counted: a restore skips them as corrupt).
std::vector<std::string> checkpoints_not_of_kind(const std::string& root, const std::string& kind);
// The steps N > `step` of the ckpt-<N> directories under `root`, ascending (none when root does
// not exist).
std::vector<std::int64_t> checkpoint_steps_after(const std::string& root, std::int64_t step);

// Deletes what save_checkpoint wrote under `root`, by name: each ckpt-<N> directory's files (and
// the directory when that empties it), those of a replacement a crash left ("ckpt-<N>.tmp.<pid>")
// and `latest`. Anything else in `root` stays, and so does `root`.
void remove_checkpoints(const std::string& root);

// The ckpt-* directory `path` names (following `latest` from a root); CheckpointError if none.
std::string resolve_checkpoint_dir(const std::string& path);
// The model weights of the checkpoint at `path`, their checksum verified, as stored.
io::NamedTensors load_checkpoint_weights(const std::string& path);

struct RestoredCheckpoint {
  TrainerState state;
  std::string dir;                   // the ckpt-* directory restored
  std::vector<std::string> skipped;  // newer ones that were unusable, each "DIR: why"
};

// The newest usable checkpoint under `root` (newest global step first; a partial or corrupt one
// is skipped and reported in `skipped`). nullopt when root holds no checkpoint at all; a
// CheckpointError listing each one and why when none is usable. Nothing is modified unless one
// loads completely.
std::optional<RestoredCheckpoint> restore_newest_usable(const std::string& root, nn::Module& model,
                                                        optim::Optimizer* optimizer);

}  // namespace hpm::train
