// TensorBoard scalars, as Keras' TensorBoard callback writes them: under a run directory, one
// events file in `train/` and one in `validation/`, named
// events.out.tfevents.<unix seconds>.<host>.<pid>.v2, each a TFRecord stream (io/tfrecord.h's
// framing, masked CRC32C) of `Event` protocol buffers (tensorflow/core/util/event.proto): first
// {wall_time, file_version: "brain.Event:2"}, then one Event per epoch whose Summary holds
// simple_value scalars tagged as Keras tags them: epoch_loss, epoch_accuracy (and every other
// metric of the objective, epoch_<name>: epoch_token_accuracy, epoch_perplexity), and in train/
// epoch_learning_rate and epoch_samples_per_s (throughput); step = the epoch, counted from 0.
// Each event is flushed when written, so a killed run keeps what it logged and TensorBoard reads
// a live run; a resumed run adds new files beside the old ones (new time and pid), as Keras does.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "hpm/train/trainer.h"

namespace hpm::train {

// One events file: the protocol buffers encoded here (the few fields used), framed as TFRecord.
class EventFileWriter {
 public:
  // Creates `dir` (and parents) and the file in it; io::IoError naming the path otherwise.
  explicit EventFileWriter(const std::string& dir);
  // One Event of scalars at `step`; io::IoError naming the file when the write fails.
  void add_scalars(std::int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

class TensorBoardLogger : public Callback {
 public:
  // The run directory; its train/ and validation/ files are created at once (so that an
  // unwritable directory fails before training).
  // Both splits log the same tags (Keras': "epoch_loss", "epoch_" + each metric the objective
  // names), so their curves overlay. `by_steps`: x is the global step at each evaluation, so runs
  // evaluated at other intervals overlay too; else the epoch.
  explicit TensorBoardLogger(const std::string& run_dir, bool by_steps = false);
  void on_epoch_end(Trainer&, const EpochLogs& e) override;

 private:
  EventFileWriter train_, validation_;
  bool by_steps_;
};

}  // namespace hpm::train
