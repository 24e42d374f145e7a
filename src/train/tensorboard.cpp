#include "hpm/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "hpm/io/crc32c.h"
#include "hpm/io/error.h"
#include "train/host_name.h"

namespace hpm::train {

namespace {

// Protocol buffer wire format: a key is (field << 3 | wire type); 0 varint, 1 fixed64,
// 2 length-delimited, 5 fixed32.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64), as the wire format is
  out.append(b, sizeof(T));
}

void bytes_field(std::string& out, int field, const std::string& value) {
  varint(out, static_cast<std::uint64_t>(field) << 3 | 2);
  varint(out, value.size());
  out += value;
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event {double wall_time = 1; int64 step = 2; oneof {string file_version = 3; Summary summary =
// 5;}}
std::string event_header(std::int64_t step) {
  std::string e;
  varint(e, 1 << 3 | 1);
  fixed(e, wall_time());
  varint(e, 2 << 3 | 0);
  varint(e, static_cast<std::uint64_t>(step));
  return e;
}

}  // namespace

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw io::IoError("tensorboard: cannot create " + dir + ": " + ec.message());
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(wall_time())) +
          "." + host_name_or("localhost") + "." + std::to_string(getpid()) + ".v2";
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw io::IoError("tensorboard: cannot create " + path_ + ": " + std::strerror(errno));
  std::string e = event_header(0);
  bytes_field(e, 3, "brain.Event:2");
  write_event(e);
}

void EventFileWriter::add_scalars(std::int64_t step,
                                  const std::vector<std::pair<std::string, float>>& scalars) {
  // Summary {repeated Value value = 1}; Value {string tag = 1; float simple_value = 2}
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    bytes_field(v, 1, tag);
    varint(v, 2 << 3 | 5);
    fixed(v, value);
    bytes_field(summary, 1, v);
  }
  std::string e = event_header(step);
  bytes_field(e, 5, summary);
  write_event(e);
}

void EventFileWriter::write_event(const std::string& event) {
  std::string record;
  fixed(record, static_cast<std::uint64_t>(event.size()));
  fixed(record, io::masked_crc32c(record.data(), 8));
  record += event;
  fixed(record, io::masked_crc32c(event.data(), event.size()));
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.flush();
  if (!out_) throw io::IoError("tensorboard: cannot write " + path_ + ": " + std::strerror(errno));
}

TensorBoardLogger::TensorBoardLogger(const std::string& run_dir, bool by_steps)
    : train_(run_dir + "/train"), validation_(run_dir + "/validation"), by_steps_(by_steps) {}

namespace {

// "epoch_loss", then "epoch_" + each other metric: the tags of either split.
std::vector<std::pair<std::string, float>> tagged(const nn::Metrics& metrics, double loss,
                                                  double accuracy) {
  std::vector<std::pair<std::string, float>> out = {{"epoch_loss", static_cast<float>(loss)}};
  if (metrics.entries().empty()) {  // logs made by hand carry no metrics
    out.emplace_back("epoch_accuracy", static_cast<float>(accuracy));
    return out;
  }
  for (const auto& m : metrics.entries()) {
    if (m.name != "loss") out.emplace_back("epoch_" + m.name, static_cast<float>(m.mean()));
  }
  return out;
}

}  // namespace

void TensorBoardLogger::on_epoch_end(Trainer&, const EpochLogs& e) {
  const std::int64_t x = by_steps_ ? e.global_step : e.epoch;
  auto train = tagged(e.train_metrics, e.train_loss, e.train_accuracy);
  train.emplace_back("epoch_learning_rate", static_cast<float>(e.lr));
  train.emplace_back("epoch_samples_per_s", static_cast<float>(e.samples_per_s));
  train_.add_scalars(x, train);
  if (e.test_accuracy >= 0) {
    validation_.add_scalars(x, tagged(e.test_metrics, e.test_loss, e.test_accuracy));
  }
}

}  // namespace hpm::train
