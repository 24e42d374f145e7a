// safetensors files (checkpoints, exported and imported weights): decoded, every tensor converted
// to f32 as loading into a model does, and an f32 re-encoding decoded to the same tensors.
#include <cstdlib>
#include <cstring>

#include "hpm/io/safetensors.h"
#include "hpm/tensor/kernels.h"

using namespace hpm;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  io::SafetensorsFile file;
  try {
    file = io::decode_safetensors(std::string_view(reinterpret_cast<const char*>(data), size),
                                  "fuzz input");
  } catch (const std::exception&) {
    return 0;
  }
  for (auto& [name, t] : file.tensors) {
    if (t.dtype() == DType::BF16 || t.dtype() == DType::F16 || t.dtype() == DType::F64) {
      t = kernels::to_f32(t);
    }
  }
  const std::string again = io::encode_safetensors(file.tensors, file.metadata);
  const io::SafetensorsFile back = io::decode_safetensors(again, "re-encoded");
  if (back.tensors.size() != file.tensors.size()) std::abort();
  // By name: empty tensors share an offset, and those come back in name order.
  for (const auto& [name, a] : file.tensors) {
    const Tensor& b = back.at(name);
    if (a.shape() != b.shape() || a.dtype() != b.dtype() || a.nbytes() != b.nbytes() ||
        std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0) {
      std::abort();
    }
  }
  return 0;
}
