// The safetensors format (https://github.com/huggingface/safetensors), hpm's checkpoint and
// weight format, readable by PyTorch, JAX and the Hugging Face tools:
//
//   8 bytes   N, little-endian u64: the header size
//   N bytes   JSON object: name -> {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
//             with offsets relative to the data section, plus an optional "__metadata__" object
//             of string -> string; padded with spaces to a multiple of 8 bytes
//   rest      the data section: the tensors' little-endian bytes, back to back, with no holes
//
// Decoding validates everything (sizes, JSON, fields, dtypes, shapes, offsets, full coverage of
// the data section), so a corrupt or hostile file yields an IoError naming the file and tensor,
// never an out-of-bounds read or a garbage tensor.
#pragma once
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hpm/io/error.h"
#include "hpm/tensor/tensor.h"

namespace hpm::io {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The file bytes: tensors laid out in the given order; the header lists "__metadata__" (if any)
// first and then the tensors in that order. IoError on duplicate names, an undefined tensor or a
// tensor named "__metadata__".
std::string encode_safetensors(const NamedTensors& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// encode_safetensors + write_file_atomic.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  // In file order (sorted by data offset; empty tensors at the same offset by name). Each tensor
  // owns a copy of its data on the CPU device.
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
  std::string path;

  // IoError "no tensor 'x' in <path>".
  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
};

// `path_for_errors` names the source in error messages and becomes SafetensorsFile::path.
SafetensorsFile decode_safetensors(std::string_view bytes, const std::string& path_for_errors);
SafetensorsFile load_safetensors(const std::string& path);
// The "__metadata__" of the file at `path`, reading its header alone (not its tensors), with the
// header's checks and errors as decode_safetensors makes them.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

}  // namespace hpm::io
