#include "hpm/train/callbacks.h"

#include <cerrno>
#include <cstring>

#include "hpm/io/atomic_file.h"

namespace hpm::train {

namespace {
std::string eta(double seconds) {
  char buf[32];
  const int s = static_cast<int>(seconds + 0.5);
  std::snprintf(buf, sizeof buf, "%d:%02d", s / 60, s % 60);
  return buf;
}
}  // namespace

ProgressCallback::ProgressCallback(std::FILE* out, bool tty, std::int64_t epochs,
                                   std::int64_t every)
    : out_(out), tty_(tty), epochs_(epochs), every_(every) {}

void ProgressCallback::on_epoch_begin(Trainer&, std::int64_t) {
  epoch_start_ = std::chrono::steady_clock::now();
  last_draw_ = {};
}

void ProgressCallback::on_batch_end(Trainer&, const BatchLogs& b) {
  const auto now = std::chrono::steady_clock::now();
  const bool known = b.steps_per_epoch > 0;  // pipelines of unknown length show no bar or ETA
  const double remaining =
      known && b.samples_per_s > 0 ? static_cast<double>(b.steps_per_epoch - b.step_in_epoch) *
                                (std::chrono::duration<double>(now - epoch_start_).count() /
                                 static_cast<double>(b.step_in_epoch))
                          : 0.0;
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && b.step_in_epoch != b.steps_per_epoch)
      return;
    last_draw_ = now;
    if (!known) {
      std::fprintf(out_, "\r\033[Kepoch %lld/%lld step %lld loss %.4f acc %.4f %.0f samples/s",
                   static_cast<long long>(b.epoch + 1), static_cast<long long>(epochs_),
                   static_cast<long long>(b.step_in_epoch), b.running_loss, b.running_accuracy,
                   b.samples_per_s);
      std::fflush(out_);
      return;
    }
    constexpr int kWidth = 30;
    const auto filled = static_cast<int>(kWidth * b.step_in_epoch / b.steps_per_epoch);
    std::fprintf(out_, "\r\033[Kepoch %lld/%lld [%s%s] %lld/%lld loss %.4f acc %.4f %.0f samples/s ETA %s",
                 static_cast<long long>(b.epoch + 1), static_cast<long long>(epochs_),
                 std::string(static_cast<std::size_t>(filled), '=').c_str(),
                 std::string(static_cast<std::size_t>(kWidth - filled), ' ').c_str(),
                 static_cast<long long>(b.step_in_epoch), static_cast<long long>(b.steps_per_epoch),
                 b.running_loss, b.running_accuracy, b.samples_per_s, eta(remaining).c_str());
    std::fflush(out_);
  } else if (every_ > 0 && b.step_in_epoch % every_ == 0) {
    std::fprintf(out_, "epoch %lld step %lld/%lld loss %.4f acc %.4f samples/s %.0f eta %s\n",
                 static_cast<long long>(b.epoch + 1), static_cast<long long>(b.step_in_epoch),
                 static_cast<long long>(b.steps_per_epoch), b.running_loss, b.running_accuracy,
                 b.samples_per_s, eta(remaining).c_str());
    std::fflush(out_);
  }
}

void ProgressCallback::on_epoch_end(Trainer&, const EpochLogs& e) {
  if (tty_) std::fprintf(out_, "\n");
  std::fprintf(out_, "epoch %lld/%lld: loss %.4f acc %.4f", static_cast<long long>(e.epoch + 1),
               static_cast<long long>(epochs_), e.train_loss, e.train_accuracy);
  if (e.test_accuracy >= 0) {
    std::fprintf(out_, " test_loss %.4f test_acc %.4f", e.test_loss, e.test_accuracy);
  }
  std::fprintf(out_, " %.0f samples/s %.1fs input-bound %.1f%%\n", e.samples_per_s, e.seconds,
               100.0 * e.input_bound);
  std::fflush(out_);
}

CsvLogger::CsvLogger(const std::string& path) : path_(path), out_(path, std::ios::trunc) {
  if (!out_) throw io::IoError("cannot create metrics log " + path + ": " + std::strerror(errno));
  out_ << "epoch,train_loss,train_accuracy,test_loss,test_accuracy,lr,samples_per_s,seconds\n";
  out_.flush();
}

void CsvLogger::on_epoch_end(Trainer&, const EpochLogs& e) {
  out_ << e.epoch + 1 << ',' << e.train_loss << ',' << e.train_accuracy << ',';
  if (e.test_accuracy >= 0) out_ << e.test_loss << ',' << e.test_accuracy;
  else out_ << ',';
  out_ << ',' << e.lr << ',' << e.samples_per_s << ',' << e.seconds << '\n';
  out_.flush();
  if (!out_) throw io::IoError("cannot write metrics log " + path_ + ": " + std::strerror(errno));
}

}  // namespace hpm::train
