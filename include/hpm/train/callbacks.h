// Standard callbacks: a progress display (a bar on a terminal, plain lines otherwise) and a CSV
// metrics log.
#pragma once
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "hpm/train/trainer.h"

namespace hpm::train {

class ProgressCallback : public Callback {
 public:
  // `tty` chooses the redrawn bar; plain mode prints a line every `every` steps and per epoch.
  ProgressCallback(std::FILE* out, bool tty, std::int64_t epochs, std::int64_t every = 200);
  void on_epoch_begin(Trainer&, std::int64_t epoch) override;
  void on_batch_end(Trainer&, const BatchLogs& b) override;
  void on_epoch_end(Trainer&, const EpochLogs& e) override;

 private:
  std::FILE* out_;
  bool tty_;
  std::int64_t epochs_, every_;
  std::chrono::steady_clock::time_point last_draw_, epoch_start_;
};

class CsvLogger : public Callback {
 public:
  explicit CsvLogger(const std::string& path);  // throws io::IoError if it cannot be created
  void on_epoch_end(Trainer&, const EpochLogs& e) override;

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace hpm::train
