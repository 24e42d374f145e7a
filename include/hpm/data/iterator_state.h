// Iterator state as bytes: a flat, versioned, little-endian record of what each stage needs to
// continue. Readers check every length, so a truncated or foreign state is a DataError, never
// undefined behaviour.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hpm/tensor/tensor.h"

namespace hpm::data {

class StateWriter {
 public:
  void u64(std::uint64_t v);
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void f64(double v);
  void str(std::string_view s);
  void tensor(const Tensor& t);
  void tensors(const std::vector<Tensor>& ts);
  // A tag per stage, checked on restore: restoring into a different pipeline fails clearly.
  void tag(std::string_view stage) { str(stage); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class StateReader {
 public:
  explicit StateReader(std::string_view bytes) : bytes_(bytes) {}
  std::uint64_t u64();
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  double f64();
  std::string str();
  Tensor tensor();
  std::vector<Tensor> tensors();
  void expect_tag(std::string_view stage);
  bool at_end() const { return pos_ == bytes_.size(); }

 private:
  void need(std::size_t n, const char* what);
  std::string_view bytes_;
  std::size_t pos_ = 0;
};

}  // namespace hpm::data
