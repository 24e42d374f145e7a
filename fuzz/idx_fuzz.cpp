// IDX files (raw or gzip'd, as Fashion-MNIST is distributed): read, then converted to the f32 and
// i64 tensors the data sources make of them.
#include "fuzz_util.h"
#include "hpm/io/idx.h"

using namespace hpm;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::InputFile file(".idx");
  try {
    const io::IdxArray a = io::read_idx(file.write(data, size));
    io::idx_to_f32(a, 1.0f / 255);
    io::idx_to_i64(a);
  } catch (const std::exception&) {
  }
  return 0;
}
