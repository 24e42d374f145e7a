#include "hpm/data/iterator_state.h"

#include <cstring>

#include "hpm/data/dataset.h"

namespace hpm::data {

void StateWriter::u64(std::uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  bytes_.append(b, 8);
}

void StateWriter::f64(double v) {
  std::uint64_t u;
  std::memcpy(&u, &v, 8);
  u64(u);
}

void StateWriter::str(std::string_view s) {
  u64(s.size());
  bytes_.append(s);
}

void StateWriter::tensor(const Tensor& t) {
  u64(static_cast<std::uint64_t>(t.dtype()));
  u64(static_cast<std::uint64_t>(t.dim()));
  for (auto d : t.shape().dims()) i64(d);
  bytes_.append(static_cast<const char*>(t.raw_data()), t.nbytes());
}

void StateWriter::tensors(const std::vector<Tensor>& ts) {
  u64(ts.size());
  for (const auto& t : ts) tensor(t);
}

void StateReader::need(std::size_t n, const char* what) {
  if (bytes_.size() - pos_ < n) {
    throw DataError("iterator state", std::string("truncated while reading ") + what + " at byte " +
                                          std::to_string(pos_));
  }
}

std::uint64_t StateReader::u64() {
  need(8, "an integer");
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<std::uint64_t>(
             static_cast<unsigned char>(bytes_[pos_ + static_cast<std::size_t>(i)]))
         << (8 * i);
  pos_ += 8;
  return v;
}

double StateReader::f64() {
  const std::uint64_t u = u64();
  double v;
  std::memcpy(&v, &u, 8);
  return v;
}

std::string StateReader::str() {
  const std::uint64_t n = u64();
  need(n, "a string");
  std::string s(bytes_.substr(pos_, n));
  pos_ += n;
  return s;
}

Tensor StateReader::tensor() {
  const auto dtype = static_cast<DType>(u64());
  if (dtype_size(dtype) == 0) throw DataError("iterator state", "unknown dtype");
  const std::uint64_t rank = u64();
  if (rank > 16)
    throw DataError("iterator state", "implausible tensor rank " + std::to_string(rank));
  std::vector<std::int64_t> dims;
  for (std::uint64_t i = 0; i < rank; ++i) {
    dims.push_back(i64());
    if (dims.back() < 0) throw DataError("iterator state", "negative dimension");
  }
  Tensor t = Tensor::empty(Shape(dims), dtype);
  need(t.nbytes(), "tensor data");
  std::memcpy(t.raw_data(), bytes_.data() + pos_, t.nbytes());
  pos_ += t.nbytes();
  return t;
}

std::vector<Tensor> StateReader::tensors() {
  const std::uint64_t n = u64();
  std::vector<Tensor> out;
  for (std::uint64_t i = 0; i < n; ++i) out.push_back(tensor());
  return out;
}

void StateReader::expect_tag(std::string_view stage) {
  const std::string got = str();
  if (got != stage) {
    throw DataError("iterator state", "expected state of stage '" + std::string(stage) +
                                          "', found '" + got +
                                          "': the pipeline differs from the saved one");
  }
}

}  // namespace hpm::data
