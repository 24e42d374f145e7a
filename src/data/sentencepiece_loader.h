// SentencePiece, loaded apart. Debian's libsentencepiece carries its own copy of protobuf-lite
// (3.14) and exports its symbols; a process that also loads the system's libprotobuf (3.21, which
// gRPC links for the parameter servers) binds one library's protobuf calls to the other's code
// and crashes before main. So hpm links SentencePiece into libhpm_sentencepiece.so
// (sentencepiece_library/) and opens that with dlmopen in a link namespace of its own, once per
// process, where its protobuf cannot meet anyone else's; only C types cross (library.h).
//
// The library is looked for at $HPM_SENTENCEPIECE_LIBRARY, beside the running executable, then
// where the build put it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hpm::data::spm {

// One loaded model. Errors are std::runtime_error with SentencePiece's message; the caller names
// the file.
class Model {
 public:
  // The serialized model (a .model file's bytes).
  explicit Model(const std::string& bytes);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  int piece_size() const;
  int unk_id() const;
  std::string piece(int id) const;
  float score(int id) const;
  std::vector<int> encode(std::string_view text) const;
  // Byte spans [begin, end) of `text` that encode to <unk>.
  std::vector<std::pair<std::size_t, std::size_t>> unknown_spans(std::string_view text) const;
  std::string decode(const std::vector<int>& ids) const;

 private:
  void* handle_ = nullptr;
};

// SentencePieceTrainer::Train over `lines` with `options` (key, value); the serialized model.
std::string train(const std::vector<std::pair<std::string, std::string>>& options,
                  const std::vector<std::string>& lines);

}  // namespace hpm::data::spm
