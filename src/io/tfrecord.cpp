#include "hpm/io/tfrecord.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "hpm/io/crc32c.h"

namespace hpm::io {
namespace {

constexpr std::size_t kHeaderBytes = 12;  // length + length CRC
constexpr std::size_t kFooterBytes = 4;   // data CRC

std::string errno_text(int err) { return std::strerror(err); }

// A compressed file read as uncompressed fails on its first header: say so when its first bytes
// are gzip's magic number or a zlib header (CMF 78, FLG for each compression level).
std::string compression_hint(Compression c, std::uint64_t start, const char* header,
                             std::size_t n) {
  if (c != Compression::None || start != 0 || n < 2) return "";
  const auto b0 = static_cast<unsigned char>(header[0]);
  const auto b1 = static_cast<unsigned char>(header[1]);
  if (b0 == 0x1f && b1 == 0x8b) {
    return "; the file starts with gzip's magic bytes 1f 8b: it is compressed, read it with "
           "compression GZIP ([data] compression = \"gzip\", --compression gzip)";
  }
  if (b0 == 0x78 && (b1 == 0x01 || b1 == 0x5e || b1 == 0x9c || b1 == 0xda)) {
    char bytes[8];
    std::snprintf(bytes, sizeof bytes, "78 %02x", b1);
    return std::string("; the file starts with the zlib header ") + bytes +
           ": it is compressed, read it with compression ZLIB ([data] compression = \"zlib\", "
           "--compression zlib)";
  }
  return "";
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", static_cast<unsigned>(v));
  return buf;
}

void put_u32(char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
}
void put_u64(char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
}
std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

int window_bits(Compression c) { return c == Compression::Gzip ? 15 + 16 : 15; }

std::string parent_directory(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Compression compression_from_name(const std::string& name) {
  if (name.empty() || name == "NONE" || name == "none") return Compression::None;
  if (name == "ZLIB" || name == "zlib") return Compression::Zlib;
  if (name == "GZIP" || name == "gzip") return Compression::Gzip;
  throw IoError("unknown compression type '" + name + "': expected \"\", NONE, ZLIB or GZIP");
}

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::None:
      return "NONE";
    case Compression::Zlib:
      return "ZLIB";
    case Compression::Gzip:
      return "GZIP";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// InputStream

struct InputStream::Zlib {
  z_stream zs{};
  std::unique_ptr<char[]> in;  // compressed bytes [zs.next_in, +avail_in) are unread
  std::size_t in_cap = 0;
  bool stream_end = false;  // the current zlib/gzip member is complete
  ~Zlib() { inflateEnd(&zs); }
};

InputStream::InputStream(std::string path, Compression compression, std::size_t buffer_size)
    : path_(std::move(path)),
      compression_(compression),
      cap_(std::max<std::size_t>(buffer_size, 4096)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    throw IoError("cannot open " + path_ + ": " + errno_text(err));
  }
  buf_ = std::make_unique<char[]>(cap_);
  if (compression_ != Compression::None) {
    z_ = std::make_unique<Zlib>();
    z_->in_cap = cap_;
    z_->in = std::make_unique<char[]>(z_->in_cap);
    if (inflateInit2(&z_->zs, window_bits(compression_)) != Z_OK) {
      ::close(fd_);
      throw IoError(path_ + ": cannot initialise zlib inflate");
    }
  }
}

InputStream::~InputStream() {
  if (fd_ >= 0) ::close(fd_);
}

bool InputStream::fill_input() {
  for (;;) {
    const ssize_t n = ::read(fd_, z_->in.get(), z_->in_cap);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw IoError("cannot read " + path_ + " at byte offset " + std::to_string(file_offset_) +
                    ": " + errno_text(err));
    }
    z_->zs.next_in = reinterpret_cast<Bytef*>(z_->in.get());
    z_->zs.avail_in = static_cast<uInt>(n);
    file_offset_ += static_cast<std::uint64_t>(n);
    return n > 0;
  }
}

bool InputStream::fill() {
  if (pos_ < len_) return true;
  pos_ = len_ = 0;
  if (eof_) return false;
  if (!z_) {
    for (;;) {
      const ssize_t n = ::read(fd_, buf_.get(), cap_);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        throw IoError("cannot read " + path_ + " at byte offset " + std::to_string(file_offset_) +
                      ": " + errno_text(err));
      }
      file_offset_ += static_cast<std::uint64_t>(n);
      len_ = static_cast<std::size_t>(n);
      if (n == 0) eof_ = true;
      return n > 0;
    }
  }
  z_stream& zs = z_->zs;
  const std::string kind = compression_name(compression_);
  while (len_ == 0) {
    const std::uint64_t consumed_before = file_offset_ - zs.avail_in;
    if (z_->stream_end) {
      // End of one member: the file ends here, or another stream follows (like zcat).
      if (zs.avail_in == 0 && !fill_input()) {
        eof_ = true;
        return false;
      }
      if (compression_ == Compression::Gzip &&
          (zs.avail_in < 2 || zs.next_in[0] != 0x1f || zs.next_in[1] != 0x8b)) {
        throw IoError(path_ +
                      ": unexpected bytes after the end of the gzip stream at file offset " +
                      std::to_string(consumed_before) +
                      " (expected the end of the file or another gzip member)");
      }
      inflateReset(&zs);
      z_->stream_end = false;
    }
    if (zs.avail_in == 0 && !fill_input()) {
      if (file_offset_ == 0) {  // an empty file holds no records, compressed or not
        eof_ = true;
        return false;
      }
      throw IoError(path_ + ": " + kind + " stream is truncated: the file ends at byte " +
                    std::to_string(file_offset_) + " inside the compressed data (" +
                    std::to_string(position_) + " uncompressed bytes read)");
    }
    zs.next_out = reinterpret_cast<Bytef*>(buf_.get());
    zs.avail_out = static_cast<uInt>(cap_);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    len_ = cap_ - zs.avail_out;
    if (rc == Z_STREAM_END) {
      z_->stream_end = true;
    } else if (rc != Z_OK && !(rc == Z_BUF_ERROR && zs.avail_in == 0)) {
      eof_ = true;
      throw IoError(path_ + ": corrupt " + kind + " data at file offset " +
                    std::to_string(file_offset_ - zs.avail_in) + " (uncompressed offset " +
                    std::to_string(position_ + len_) +
                    "): " + (zs.msg ? zs.msg : "zlib error " + std::to_string(rc)));
    }
  }
  return true;
}

std::string_view InputStream::peek() {
  if (!fill()) return {};
  return std::string_view(buf_.get() + pos_, len_ - pos_);
}

void InputStream::consume(std::size_t n) {
  n = std::min(n, len_ - pos_);
  pos_ += n;
  position_ += n;
}

std::size_t InputStream::read(char* dst, std::size_t n) {
  std::size_t done = 0;
  while (done < n && fill()) {
    const std::size_t k = std::min(n - done, len_ - pos_);
    std::memcpy(dst + done, buf_.get() + pos_, k);
    consume(k);
    done += k;
  }
  return done;
}

std::size_t InputStream::read_append(std::string& out, std::size_t n) {
  std::size_t done = 0;
  while (done < n && fill()) {
    const std::size_t k = std::min(n - done, len_ - pos_);
    out.append(buf_.get() + pos_, k);
    consume(k);
    done += k;
  }
  return done;
}

void InputStream::rewind() {
  if (::lseek(fd_, 0, SEEK_SET) != 0) {
    const int err = errno;
    throw IoError("cannot seek in " + path_ + ": " + errno_text(err));
  }
  pos_ = len_ = 0;
  position_ = 0;
  file_offset_ = 0;
  eof_ = false;
  if (z_) {
    inflateReset(&z_->zs);
    z_->zs.avail_in = 0;
    z_->stream_end = false;
  }
}

void InputStream::skip(std::uint64_t n) {
  while (n > 0) {
    if (!fill()) {
      throw IoError("cannot seek " + path_ + " to byte " + std::to_string(position_ + n) +
                    ": the " + std::string(z_ ? "uncompressed " : "") + "stream has only " +
                    std::to_string(position_) + " bytes");
    }
    const std::size_t k = static_cast<std::size_t>(
        std::min<std::uint64_t>(n, static_cast<std::uint64_t>(len_ - pos_)));
    consume(k);
    n -= k;
  }
}

void InputStream::seek(std::uint64_t offset) {
  // Within the buffer (either direction): just move.
  const std::uint64_t buf_start = position_ - pos_;
  if (offset >= buf_start && offset <= buf_start + len_ && len_ > 0) {
    pos_ = static_cast<std::size_t>(offset - buf_start);
    position_ = offset;
    return;
  }
  if (!z_) {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      throw IoError("cannot seek in " + path_ + ": fstat: " + errno_text(err));
    }
    if (S_ISREG(st.st_mode) && offset > static_cast<std::uint64_t>(st.st_size)) {
      throw IoError("cannot seek " + path_ + " to byte " + std::to_string(offset) +
                    ": the file has only " + std::to_string(st.st_size) + " bytes");
    }
    if (::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) {
      const int err = errno;
      throw IoError("cannot seek " + path_ + " to byte " + std::to_string(offset) + ": " +
                    errno_text(err));
    }
    pos_ = len_ = 0;
    position_ = offset;
    file_offset_ = offset;
    eof_ = false;
    return;
  }
  if (offset < position_) rewind();
  skip(offset - position_);
}

// ---------------------------------------------------------------------------------------------
// TfRecordWriter

struct TfRecordWriter::Impl {
  std::string path;
  std::string tmp;
  Compression compression;
  int fd = -1;
  bool closed = false;
  bool failed = false;
  std::uint64_t offset = 0;      // uncompressed bytes accepted
  std::uint64_t file_bytes = 0;  // bytes written to the temporary file
  std::string out;               // bytes waiting for write(2)
  z_stream zs{};
  bool z_init = false;

  static constexpr std::size_t kFlushAt = std::size_t{256} << 10;

  ~Impl() {
    if (z_init) deflateEnd(&zs);
    if (fd >= 0) ::close(fd);
    if (!closed && !tmp.empty()) ::unlink(tmp.c_str());
  }

  [[noreturn]] void fail(const std::string& what) {
    failed = true;
    throw IoError("cannot write " + path + ": " + what);
  }

  void write_fd(const char* data, std::size_t n) {
    struct rlimit lim {};
    if (::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
        file_bytes + n > static_cast<std::uint64_t>(lim.rlim_cur)) {
      fail("writing " + std::to_string(n) + " bytes at byte offset " + std::to_string(file_bytes) +
           " of " + tmp + " would exceed the file size limit RLIMIT_FSIZE of " +
           std::to_string(lim.rlim_cur) + " bytes: " + errno_text(EFBIG));
    }
    std::size_t done = 0;
    while (done < n) {
      const ssize_t k = ::write(fd, data + done, n - done);
      if (k < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        fail("write to " + tmp + " failed at byte offset " + std::to_string(file_bytes) + ": " +
             errno_text(err));
      }
      if (k == 0) {
        fail("write to " + tmp + " made no progress at byte offset " + std::to_string(file_bytes));
      }
      done += static_cast<std::size_t>(k);
      file_bytes += static_cast<std::uint64_t>(k);
    }
  }

  void flush_out() {
    if (!out.empty()) write_fd(out.data(), out.size());
    out.clear();
  }

  // Feeds bytes through the compressor (or straight into `out`).
  void put(const char* data, std::size_t n, int flush = Z_NO_FLUSH) {
    if (!z_init) {
      out.append(data, n);
      if (out.size() >= kFlushAt) flush_out();
      return;
    }
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
    zs.avail_in = 0;
    std::size_t left = n;
    for (;;) {
      if (zs.avail_in == 0 && left > 0) {
        const std::size_t piece = std::min<std::size_t>(left, std::size_t{1} << 30);
        zs.avail_in = static_cast<uInt>(piece);
        left -= piece;
      }
      const std::size_t before = out.size();
      out.resize(before + 64 * 1024);
      zs.next_out = reinterpret_cast<Bytef*>(out.data() + before);
      zs.avail_out = 64 * 1024;
      const int f = left > 0 ? Z_NO_FLUSH : flush;
      const int rc = deflate(&zs, f);
      out.resize(before + 64 * 1024 - zs.avail_out);
      if (rc == Z_STREAM_ERROR) fail("zlib deflate failed");
      if (out.size() >= kFlushAt) flush_out();
      if (f == Z_FINISH) {
        if (rc == Z_STREAM_END) break;
      } else if (zs.avail_in == 0 && left == 0 && zs.avail_out != 0) {
        break;
      }
    }
  }
};

TfRecordWriter::TfRecordWriter(std::string path, Compression compression)
    : impl_(std::make_unique<Impl>()) {
  Impl& w = *impl_;
  if (path.empty()) throw IoError("TfRecordWriter: empty path");
  w.path = std::move(path);
  w.compression = compression;
  const std::string tmp = w.path + ".tmp." + std::to_string(::getpid());
  w.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (w.fd < 0) {
    const int err = errno;
    throw IoError("cannot write " + w.path + ": cannot create temporary file " + tmp + ": " +
                  errno_text(err));
  }
  w.tmp = tmp;
  if (compression != Compression::None) {
    if (deflateInit2(&w.zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window_bits(compression), 8,
                     Z_DEFAULT_STRATEGY) != Z_OK) {
      w.fail("cannot initialise zlib deflate");
    }
    w.z_init = true;
  }
}

TfRecordWriter::~TfRecordWriter() = default;
TfRecordWriter::TfRecordWriter(TfRecordWriter&&) noexcept = default;
TfRecordWriter& TfRecordWriter::operator=(TfRecordWriter&&) noexcept = default;

const std::string& TfRecordWriter::path() const { return impl_->path; }
std::uint64_t TfRecordWriter::offset() const { return impl_->offset; }

void TfRecordWriter::write(std::string_view record) {
  Impl& w = *impl_;
  if (w.closed) throw IoError("cannot write " + w.path + ": the writer is closed");
  if (w.failed) throw IoError("cannot write " + w.path + ": an earlier write failed");
  char header[kHeaderBytes];
  put_u64(header, record.size());
  put_u32(header + 8, masked_crc32c(header, 8));
  char footer[kFooterBytes];
  put_u32(footer, masked_crc32c(record.data(), record.size()));
  w.put(header, sizeof header);
  w.put(record.data(), record.size());
  w.put(footer, sizeof footer);
  w.offset += kHeaderBytes + record.size() + kFooterBytes;
}

void TfRecordWriter::close() {
  Impl& w = *impl_;
  if (w.closed) return;
  if (w.failed) throw IoError("cannot close " + w.path + ": an earlier write failed");
  if (w.z_init) w.put(nullptr, 0, Z_FINISH);
  w.flush_out();
  if (::fsync(w.fd) != 0) {
    const int err = errno;
    w.fail("fsync of " + w.tmp + ": " + errno_text(err));
  }
  const int rc = ::close(w.fd);
  w.fd = -1;
  if (rc != 0) {
    const int err = errno;
    w.fail("close of " + w.tmp + ": " + errno_text(err));
  }
  if (::rename(w.tmp.c_str(), w.path.c_str()) != 0) {
    const int err = errno;
    w.fail("rename of " + w.tmp + " over it failed: " + errno_text(err));
  }
  w.closed = true;
  const std::string dir = parent_directory(w.path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    const int drc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    if (drc != 0 && err != EINVAL && err != EROFS) {
      throw IoError("wrote " + w.path + " but fsync of its directory " + dir +
                    " failed: " + errno_text(err));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// TfRecordReader

TfRecordReader::TfRecordReader(std::string path, Compression compression, bool verify_crc)
    : in_(std::move(path), compression), verify_crc_(verify_crc) {}

void TfRecordReader::seek(std::uint64_t offset) {
  done_ = false;
  try {
    in_.seek(offset);
  } catch (...) {
    done_ = true;
    throw;
  }
}

bool TfRecordReader::next(std::string& record) {
  record.clear();
  if (done_) return false;
  const std::uint64_t start = in_.position();
  const auto truncated = [&](std::uint64_t expected, std::uint64_t found) {
    done_ = true;
    return IoError(path() + ": truncated record at byte " + std::to_string(start) + ": expected " +
                   std::to_string(expected) + " bytes, found " + std::to_string(found) +
                   " before the end of the file");
  };
  bool resumable = false;  // only a data CRC mismatch leaves the stream at a record boundary
  try {
    char header[kHeaderBytes];
    const std::size_t got = in_.read(header, sizeof header);
    if (got == 0) {
      done_ = true;
      return false;
    }
    if (got < sizeof header) {
      done_ = true;
      throw IoError(path() + ": truncated record at byte " + std::to_string(start) +
                    ": expected a 12-byte record header, found " + std::to_string(got) +
                    " bytes before the end of the file" +
                    compression_hint(in_.compression(), start, header, got));
    }
    const std::uint64_t length = get_u64(header);
    if (verify_crc_) {
      const std::uint32_t stored = get_u32(header + 8);
      const std::uint32_t actual = masked_crc32c(header, 8);
      if (stored != actual) {
        done_ = true;
        throw IoError(path() + ": corrupt record at byte " + std::to_string(start) +
                      ": length CRC mismatch (expected masked CRC " + hex32(actual) +
                      " of the length bytes, found " + hex32(stored) +
                      "); the following records cannot be located" +
                      compression_hint(in_.compression(), start, header, sizeof header));
      }
    }
    const std::uint64_t total = kHeaderBytes + length + kFooterBytes;
    // Grow with the data actually read, so a corrupt length never allocates a huge buffer.
    record.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(length, 1u << 20)));
    const std::size_t data = in_.read_append(record, static_cast<std::size_t>(length));
    if (data < length) {
      record.clear();
      throw truncated(total, kHeaderBytes + data);
    }
    char footer[kFooterBytes];
    const std::size_t fgot = in_.read(footer, sizeof footer);
    if (fgot < sizeof footer) {
      record.clear();
      throw truncated(total, kHeaderBytes + length + fgot);
    }
    if (verify_crc_) {
      const std::uint32_t stored = get_u32(footer);
      const std::uint32_t actual = masked_crc32c(record.data(), record.size());
      if (stored != actual) {
        record.clear();
        resumable = true;
        throw IoError(path() + ": corrupt record at byte " + std::to_string(start) +
                      ": data CRC mismatch over " + std::to_string(length) +
                      " data bytes (expected masked CRC " + hex32(actual) + ", found " +
                      hex32(stored) + "); next() continues with the following record");
      }
    }
    return true;
  } catch (...) {
    // Read errors and corrupt compressed data end the stream too (see the header).
    if (!resumable) done_ = true;
    throw;
  }
}

std::vector<std::string> read_tfrecord_file(const std::string& path, Compression compression) {
  TfRecordReader reader(path, compression);
  std::vector<std::string> records;
  std::string r;
  while (reader.next(r)) records.push_back(std::move(r));
  return records;
}

}  // namespace hpm::io
