#include "hpm/data/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "hpm/data/dataset.h"
#include "hpm/data/file_sources.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/crc32c.h"

namespace hpm::data {

static_assert(std::endian::native == std::endian::little,
              "token shards map little-endian ids straight into memory");

namespace {

constexpr char kMagic[8] = {'H', 'P', 'M', 'T', 'O', 'K', 'E', 'N'};
// Field offsets, for the header and for errors.
constexpr std::size_t kVersionAt = 8, kWidthAt = 12, kVocabAt = 16, kCountAt = 24,
                      kPayloadCrcAt = 32, kTokenizerAt = 36, kHeaderCrcAt = 60;

template <typename T>
void put(unsigned char* at, T v) {
  std::memcpy(at, &v, sizeof v);
}
template <typename T>
T get(const unsigned char* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string at_byte(std::size_t offset) { return "byte " + std::to_string(offset) + ": "; }

// The magic as found, printable characters as themselves and the rest escaped.
std::string shown(const unsigned char* p, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\') {
      s.push_back(static_cast<char>(p[i]));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      s += buf;
    }
  }
  return s;
}

// Checks the 64 header bytes of a file of `file_bytes` bytes.
TokenShardHeader parse_header(const std::string& path, const unsigned char* h,
                              std::size_t file_bytes) {
  if (file_bytes < kTokenShardHeaderBytes) {
    throw DataError(path, "truncated: " + std::to_string(file_bytes) +
                              " bytes, shorter than the 64-byte header of a token shard");
  }
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) {
    throw DataError(path, at_byte(0) + "not an hpm token shard: magic \"" + shown(h, 8) +
                              "\", expected \"HPMTOKEN\"");
  }
  TokenShardHeader hd;
  hd.version = get<std::uint32_t>(h + kVersionAt);
  if (hd.version != kTokenShardVersion) {
    throw DataError(path, at_byte(kVersionAt) + "version " + std::to_string(hd.version) +
                              " is not supported (this hpm reads version " +
                              std::to_string(kTokenShardVersion) + ")");
  }
  const std::uint32_t stored = get<std::uint32_t>(h + kHeaderCrcAt),
                      computed = io::crc32c(h, kHeaderCrcAt);
  if (stored != computed) {
    throw DataError(path, at_byte(kHeaderCrcAt) + "header checksum mismatch: stored " +
                              hex(stored) + ", bytes 0-59 hash to " + hex(computed) +
                              " (a corrupt header)");
  }
  hd.token_bytes = get<std::uint32_t>(h + kWidthAt);
  if (hd.token_bytes != 2 && hd.token_bytes != 4) {
    throw DataError(path, at_byte(kWidthAt) + "token width " + std::to_string(hd.token_bytes) +
                              " bytes, expected 2 (u16) or 4 (u32)");
  }
  const auto vocab = get<std::uint64_t>(h + kVocabAt), count = get<std::uint64_t>(h + kCountAt);
  const std::uint64_t limit = hd.token_bytes == 2 ? 65536u : 4294967296u;
  if (vocab == 0 || vocab > limit) {
    throw DataError(path, at_byte(kVocabAt) + "vocabulary size " + std::to_string(vocab) +
                              " does not fit tokens of " + std::to_string(hd.token_bytes) +
                              " bytes (1 to " + std::to_string(limit) + ")");
  }
  hd.vocab_size = static_cast<std::int64_t>(vocab);
  const std::uint64_t payload = file_bytes - kTokenShardHeaderBytes;
  if (count > payload / hd.token_bytes || count * hd.token_bytes != payload) {
    const std::string expected =
        count > (UINT64_MAX - kTokenShardHeaderBytes) / hd.token_bytes
            ? "more bytes than a file can hold"
            : std::to_string(kTokenShardHeaderBytes + count * hd.token_bytes) + " bytes in all";
    throw DataError(path, std::string(count > payload / hd.token_bytes ? "truncated" : "too long") +
                              ": the header (byte " + std::to_string(kCountAt) + ") counts " +
                              std::to_string(count) + " tokens of " +
                              std::to_string(hd.token_bytes) + " bytes, " + expected +
                              "; the file holds " + std::to_string(file_bytes));
  }
  hd.count = static_cast<std::int64_t>(count);
  hd.payload_crc32c = get<std::uint32_t>(h + kPayloadCrcAt);
  hd.tokenizer = get<std::uint32_t>(h + kTokenizerAt);
  return hd;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::size_t open_sized(const std::string& path, Fd& f) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw DataError(path, "cannot open: " + std::string(std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    throw DataError(path, "cannot stat: " + std::string(std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw DataError(path, "not a regular file");
  return static_cast<std::size_t>(st.st_size);
}

}  // namespace

std::uint32_t token_width(std::int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

std::vector<std::string> token_shard_files(const std::string& pattern) {
  std::vector<std::string> files;
  for (const std::string& path : glob_paths(pattern)) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(path);
  }
  if (files.empty()) throw DataError(pattern, "no token shard matches");
  return files;
}

void write_token_shard(const std::string& path, const std::vector<std::int64_t>& ids,
                       std::int64_t vocab_size, std::uint32_t tokenizer_fingerprint) {
  if (vocab_size < 1 || vocab_size > 4294967296LL) {
    throw std::invalid_argument("write_token_shard " + path + ": vocabulary size " +
                                std::to_string(vocab_size) + " outside [1, 2^32]");
  }
  const std::uint32_t width = token_width(vocab_size);
  std::string file(kTokenShardHeaderBytes + ids.size() * width, '\0');
  auto* h = reinterpret_cast<unsigned char*>(file.data());
  unsigned char* payload = h + kTokenShardHeaderBytes;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t id = ids[i];
    if (id < 0 || id >= vocab_size) {
      throw std::invalid_argument("write_token_shard " + path + ": token " + std::to_string(id) +
                                  " at index " + std::to_string(i) +
                                  " is outside the vocabulary of " + std::to_string(vocab_size));
    }
    if (width == 2) {
      put(payload + 2 * i, static_cast<std::uint16_t>(id));
    } else {
      put(payload + 4 * i, static_cast<std::uint32_t>(id));
    }
  }
  std::memcpy(h, kMagic, sizeof kMagic);
  put(h + kVersionAt, kTokenShardVersion);
  put(h + kWidthAt, width);
  put(h + kVocabAt, static_cast<std::uint64_t>(vocab_size));
  put(h + kCountAt, static_cast<std::uint64_t>(ids.size()));
  put(h + kPayloadCrcAt, io::crc32c(payload, ids.size() * width));
  put(h + kTokenizerAt, tokenizer_fingerprint);
  put(h + kHeaderCrcAt, io::crc32c(h, kHeaderCrcAt));
  io::write_file_atomic(path, file);
}

TokenShardHeader read_token_shard_header(const std::string& path) {
  Fd f;
  const std::size_t bytes = open_sized(path, f);
  unsigned char h[kTokenShardHeaderBytes] = {};
  const ssize_t got = ::pread(f.fd, h, sizeof h, 0);
  if (got < 0) throw DataError(path, "cannot read: " + std::string(std::strerror(errno)));
  // A file shorter than the header reads short: parse_header reports it truncated.
  return parse_header(
      path, h, static_cast<std::size_t>(got) < sizeof h ? static_cast<std::size_t>(got) : bytes);
}

std::shared_ptr<const TokenShard> TokenShard::open(const std::string& path) {
  Fd f;
  const std::size_t bytes = open_sized(path, f);
  std::shared_ptr<TokenShard> s(new TokenShard());
  s->path_ = path;
  unsigned char h[kTokenShardHeaderBytes] = {};
  s->read_bytes(f.fd, h, std::min(bytes, sizeof h), 0);
  s->header_ = parse_header(path, h, bytes);
  s->fd_ = std::exchange(f.fd, -1);
  const TokenShardHeader& hd = s->header_;
  // The payload's checksum, then every id inside the vocabulary (a checksum that holds over ids
  // outside it is a writer's bug; say which), a chunk at a time.
  constexpr std::int64_t kChunk = 1 << 16;
  std::vector<unsigned char> raw(static_cast<std::size_t>(kChunk) * hd.token_bytes);
  std::vector<std::int64_t> ids(kChunk);
  std::uint32_t crc = 0;
  for (std::int64_t i = 0; i < hd.count; i += kChunk) {
    const std::int64_t n = std::min(hd.count - i, kChunk);
    const std::size_t n_bytes = static_cast<std::size_t>(n) * hd.token_bytes;
    s->read_bytes(s->fd_, raw.data(), n_bytes,
                  kTokenShardHeaderBytes + static_cast<std::size_t>(i) * hd.token_bytes);
    crc = io::crc32c(raw.data(), n_bytes, crc);
    s->decode(raw.data(), n, ids.data());
    for (std::int64_t j = 0; j < n; ++j) {
      if (ids[static_cast<std::size_t>(j)] < hd.vocab_size) continue;
      const std::size_t at =
          kTokenShardHeaderBytes + static_cast<std::size_t>(i + j) * hd.token_bytes;
      throw DataError(
          path, at_byte(at) + "token " + std::to_string(ids[static_cast<std::size_t>(j)]) +
                    " (index " + std::to_string(i + j) + ") is outside the vocabulary of " +
                    std::to_string(hd.vocab_size) + " (byte " + std::to_string(kVocabAt) + ")");
    }
  }
  if (crc != hd.payload_crc32c) {
    throw DataError(
        path, at_byte(kTokenShardHeaderBytes) + "payload checksum mismatch: the header (byte " +
                  std::to_string(kPayloadCrcAt) + ") says " + hex(hd.payload_crc32c) + ", the " +
                  std::to_string(hd.count) + " tokens hash to " + hex(crc) + " (a corrupt shard)");
  }
  return s;
}

TokenShard::~TokenShard() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenShard::read_bytes(int fd, unsigned char* out, std::size_t n, std::size_t offset) const {
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw DataError(path_, at_byte(offset) + "cannot read: " + std::strerror(errno));
    }
    if (got == 0) {
      throw DataError(path_, at_byte(offset) +
                                 "the file ends early: it was truncated or replaced in place "
                                 "after it was opened (write shards to a new name and rename "
                                 "them over, never in place, while a run reads them)");
    }
    out += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::size_t>(got);
  }
}

void TokenShard::decode(const unsigned char* p, std::int64_t n, std::int64_t* out) const {
  if (header_.token_bytes == 2) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = get<std::uint16_t>(p + 2 * i);
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = get<std::uint32_t>(p + 4 * i);
  }
}

void TokenShard::read(std::int64_t start, std::int64_t n, std::int64_t* out) const {
  // Read, not mapped: a mapped file that shrinks under the run kills it with SIGBUS, naming
  // nothing; a read that comes up short is a DataError naming the file. A shard replaced by
  // rename keeps serving the file that was opened.
  const std::size_t bytes = static_cast<std::size_t>(n) * header_.token_bytes;
  unsigned char stack[4096];
  std::vector<unsigned char> heap;
  unsigned char* raw = stack;
  if (bytes > sizeof stack) {
    heap.resize(bytes);
    raw = heap.data();
  }
  read_bytes(fd_, raw, bytes,
             kTokenShardHeaderBytes + static_cast<std::size_t>(start) * header_.token_bytes);
  decode(raw, n, out);
}

TokenSequence::TokenSequence(Tensor ids) : ids_(std::move(ids)) {
  if (ids_.dim() != 1 || ids_.dtype() != DType::I64) {
    throw std::invalid_argument("tokens must be a 1-D I64 tensor, got " + ids_.shape().str());
  }
  size_ = ids_.size(0);
}

TokenSequence::TokenSequence(std::vector<std::shared_ptr<const TokenShard>> shards)
    : shards_(std::move(shards)) {
  for (const auto& s : shards_) {
    starts_.push_back(size_);
    size_ += s->size();
  }
}

void TokenSequence::read(std::int64_t start, std::int64_t n, std::int64_t* out) const {
  if (start < 0 || n < 0 || start + n > size_) {
    throw std::out_of_range("TokenSequence::read: tokens [" + std::to_string(start) + ", " +
                            std::to_string(start + n) + ") of " + std::to_string(size_));
  }
  if (shards_.empty()) {
    std::copy(ids_.data<std::int64_t>() + start, ids_.data<std::int64_t>() + start + n, out);
    return;
  }
  // The last shard starting at or before `start`, then onwards across boundaries.
  auto k = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) -
                                    starts_.begin() - 1);
  while (n > 0) {
    const std::int64_t local = start - starts_[k];
    const std::int64_t take = std::min(n, shards_[k]->size() - local);
    shards_[k]->read(local, take, out);
    out += take;
    start += take;
    n -= take;
    ++k;
  }
}

Tensor TokenSequence::to_tensor() const {
  if (shards_.empty()) return ids_;
  Tensor t = Tensor::empty({size_}, DType::I64);
  read(0, size_, t.data<std::int64_t>());
  return t;
}

TokenCorpus load_token_shards(const std::string& train_pattern, const std::string& val_pattern) {
  TokenCorpus c;
  std::shared_ptr<const TokenShard> first;
  std::vector<std::shared_ptr<const TokenShard>> train, val;
  for (auto [pattern, shards, names] : {std::tuple{&train_pattern, &train, &c.train_files},
                                        std::tuple{&val_pattern, &val, &c.val_files}}) {
    for (const std::string& path : token_shard_files(*pattern)) {
      shards->push_back(TokenShard::open(path));
      names->push_back(path);
      const TokenShard& s = *shards->back();
      if (!first) {
        first = shards->back();
        continue;
      }
      const TokenShard& f = *first;
      if (s.vocab_size() != f.vocab_size()) {
        throw DataError(path, at_byte(kVocabAt) + "vocabulary size " +
                                  std::to_string(s.vocab_size()) + ", but " + f.path() + " has " +
                                  std::to_string(f.vocab_size()) +
                                  ": shards of one corpus share a tokenizer");
      }
      if (s.header().tokenizer != f.header().tokenizer) {
        throw DataError(path, at_byte(kTokenizerAt) + "tokenizer " + hex(s.header().tokenizer) +
                                  ", but " + f.path() + " was made by " +
                                  hex(f.header().tokenizer) +
                                  ": shards of one corpus share a tokenizer");
      }
    }
  }
  // A shard in both splits (a training glob that also matches val-*.tokens) made the validation
  // loss one of training data, reported as held out.
  if (const std::string f = first_shared_file(c.train_files, c.val_files); !f.empty()) {
    throw DataError(f, "is matched by both the training files ('" + train_pattern +
                           "') and the validation files ('" + val_pattern +
                           "'): validation must be held out of training; narrow the "
                           "training pattern (hpm data tokenizer encode writes train-*.tokens "
                           "and val-*.tokens)");
  }
  c.vocab_size = first->vocab_size();
  c.tokenizer = first->header().tokenizer;
  c.train = TokenSequence(std::move(train));
  c.val = TokenSequence(std::move(val));
  return c;
}

}  // namespace hpm::data
