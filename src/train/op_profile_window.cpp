#include "hpm/train/op_profile_window.h"

#include "hpm/io/atomic_file.h"
#include "hpm/tensor/op_profile.h"

namespace hpm::train {

OpProfileWindow::OpProfileWindow(std::string path) : path_(std::move(path)) {}

OpProfileWindow::~OpProfileWindow() {
  if (in_step_) op_profile::stop();
}

void OpProfileWindow::on_batch_begin(Trainer& trainer, std::int64_t) {
  if (!first_seen_) {  // this run's first step: warm-up, not profiled
    first_seen_ = true;
    return;
  }
  if (steps_ == 0) op_profile::reset();
  trainer.device().stream().synchronize();
  in_step_ = true;
  op_profile::start();
  begin_ = std::chrono::steady_clock::now();
}

void OpProfileWindow::on_batch_end(Trainer& trainer, const BatchLogs&) {
  if (!in_step_) return;
  trainer.device().stream().synchronize();
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  op_profile::stop();
  in_step_ = false;
  ++steps_;
}

void OpProfileWindow::on_train_end(Trainer&, const FitResult&) {
  op_profile::stop();
  if (steps_ == 0) return;
  io::write_file_atomic(path_, op_profile::table(op_profile::rows(), seconds_, steps_));
}

}  // namespace hpm::train
