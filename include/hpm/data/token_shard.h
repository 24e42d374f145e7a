// Token shards: token ids on disk, read with pread, and TokenSequence, the tokens a language
// model trains on (ids in memory, or the concatenation of open shards).
//
// A shard is a 64-byte header and a payload of `count` little-endian ids, 2 bytes each (u16) when
// the vocabulary has at most 65,536 tokens, else 4 (u32). The header, all little-endian:
//
//   offset  size  field
//        0     8  magic "HPMTOKEN"
//        8     4  version (1)
//       12     4  token width in bytes (2 or 4)
//       16     8  vocabulary size
//       24     8  count (tokens in the payload)
//       32     4  CRC32C of the payload
//       36     4  tokenizer fingerprint (0: bytes; else the CRC32C of the SentencePiece model file)
//       40    20  reserved, zero
//       60     4  CRC32C of bytes 0-59
//       64        payload: count * width bytes, then nothing
//
//   write_token_shard("out/train-00000.tokens", ids, tokenizer->vocab_size(),
//                     tokenizer->fingerprint());
//   auto shard = TokenShard::open("out/train-00000.tokens");  // opened, checked, verified
//   TokenSequence tokens({shard});                             // what random_windows reads
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpm/tensor/tensor.h"

namespace hpm::data {

constexpr std::uint32_t kTokenShardVersion = 1;
constexpr std::size_t kTokenShardHeaderBytes = 64;

struct TokenShardHeader {
  std::uint32_t version = kTokenShardVersion;
  std::uint32_t token_bytes = 2;  // 2 or 4
  std::int64_t vocab_size = 0;
  std::int64_t count = 0;
  std::uint32_t payload_crc32c = 0;
  std::uint32_t tokenizer = 0;  // Tokenizer::fingerprint()
};

// The width a vocabulary needs: 2 up to 65,536 tokens, else 4.
std::uint32_t token_width(std::int64_t vocab_size);

// Writes `ids` (each in [0, vocab_size)) as a shard, atomically (a temporary file, fsynced, then
// renamed over `path`). Throws std::invalid_argument for an id outside the vocabulary, io::IoError
// if the file cannot be written.
void write_token_shard(const std::string& path, const std::vector<std::int64_t>& ids,
                       std::int64_t vocab_size, std::uint32_t tokenizer_fingerprint);

// The header of a shard, checked (magic, version, header checksum, width, and that the file is
// as long as the header says) without reading the payload. Throws DataError naming the file and
// the byte offset of the field that is wrong.
TokenShardHeader read_token_shard_header(const std::string& path);

// A shard kept open and read with pread (not mapped: a mapped file truncated under a run kills
// it with SIGBUS; a short read is a DataError naming the file), verified when opened: the header as
// read_token_shard_header checks it, then the payload's checksum and that every id is inside the
// vocabulary. Errors are DataErrors naming the file and the byte offset.
class TokenShard {
 public:
  static std::shared_ptr<const TokenShard> open(const std::string& path);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  const TokenShardHeader& header() const { return header_; }
  std::int64_t size() const { return header_.count; }
  std::int64_t vocab_size() const { return header_.vocab_size; }
  // Tokens [start, start + n) into out (the caller keeps the range inside the shard).
  void read(std::int64_t start, std::int64_t n, std::int64_t* out) const;

 private:
  TokenShard() = default;
  void read_bytes(int fd, unsigned char* out, std::size_t n, std::size_t offset) const;
  void decode(const unsigned char* raw, std::int64_t n, std::int64_t* out) const;
  std::string path_;
  TokenShardHeader header_;
  int fd_ = -1;
};

// A 1-D sequence of token ids: an I64 tensor, or open shards one after the other (a window may
// span two shards, as the text corpus' windows span files).
class TokenSequence {
 public:
  TokenSequence() = default;
  // A 1-D I64 tensor; std::invalid_argument for anything else.
  TokenSequence(Tensor ids);  // NOLINT(google-explicit-constructor): tensors are token sequences
  explicit TokenSequence(std::vector<std::shared_ptr<const TokenShard>> shards);

  std::int64_t size() const { return size_; }
  // Tokens [start, start + n) into out; std::out_of_range outside [0, size()).
  void read(std::int64_t start, std::int64_t n, std::int64_t* out) const;
  // All of it, as a 1-D I64 tensor (a copy for shards).
  Tensor to_tensor() const;

 private:
  Tensor ids_;
  std::vector<std::shared_ptr<const TokenShard>> shards_;
  std::vector<std::int64_t> starts_;  // first token of each shard in the sequence
  std::int64_t size_ = 0;
};

// The regular files `pattern` (a glob) matches, in name order; DataError naming the pattern when
// there are none.
std::vector<std::string> token_shard_files(const std::string& pattern);

// Training and validation tokens from shards: every file each glob matches, in name order.
struct TokenCorpus {
  TokenSequence train, val;
  std::vector<std::string> train_files, val_files;
  std::int64_t vocab_size = 0;
  std::uint32_t tokenizer = 0;  // the fingerprint every shard shares
};

// Opens (maps and verifies) the shards; throws DataError naming the pattern when none matches,
// and naming both files when two shards disagree on the vocabulary size or the tokenizer.
TokenCorpus load_token_shards(const std::string& train_pattern, const std::string& val_pattern);

}  // namespace hpm::data
