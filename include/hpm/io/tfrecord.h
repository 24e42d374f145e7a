// TFRecord files, exactly as TensorFlow writes and reads them (tf.io.TFRecordWriter,
// tf.data.TFRecordDataset), plus the buffered, optionally decompressing input stream that the
// record, text-line and CSV readers share.
//
// Each record is
//
//   uint64  length, little-endian
//   uint32  masked_crc32c(the 8 length bytes), little-endian
//   bytes   data[length]
//   uint32  masked_crc32c(data), little-endian
//
// With Compression::Zlib the whole record stream is one zlib stream (RFC 1950, with its 2-byte
// header and Adler-32 trailer); with Compression::Gzip it is a gzip stream (RFC 1952). These are
// what TensorFlow's "ZLIB" and "GZIP" compression_type options produce and accept. Offsets are
// always byte offsets in the uncompressed record stream.
//
// Errors are IoErrors that name the file, the byte offset of the record and what was expected
// versus found:
//   "<path>: truncated record at byte N: expected M bytes, found K before the end of the file"
//   "<path>: corrupt record at byte N: length CRC mismatch (expected masked CRC 0x..., found
//   0x...)"
//   "<path>: corrupt record at byte N: data CRC mismatch over L bytes (expected ..., found ...)"
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hpm/io/error.h"

namespace hpm::io {

enum class Compression { None, Zlib, Gzip };

// "" and "NONE" -> None, "ZLIB" -> Zlib, "GZIP" -> Gzip (TensorFlow's compression_type strings;
// lower case is accepted too). IoError for anything else.
Compression compression_from_name(const std::string& name);
// "NONE", "ZLIB" or "GZIP".
const char* compression_name(Compression c);

// A buffered byte stream over a file, decompressing Zlib/Gzip on the fly (concatenated streams are
// read one after the other, as zcat does). Never holds more than its buffers in memory (the
// buffer size, at least 4096 bytes, once for decompressed and once for compressed bytes). Read
// errors, corrupt or truncated compressed data are IoErrors naming the path and the offsets.
class InputStream {
 public:
  static constexpr std::size_t kDefaultBufferSize = std::size_t{256} << 10;

  InputStream(std::string path, Compression compression = Compression::None,
              std::size_t buffer_size = kDefaultBufferSize);
  ~InputStream();
  InputStream(const InputStream&) = delete;
  InputStream& operator=(const InputStream&) = delete;

  // Copies up to n bytes into dst; fewer only at the end of the stream. Returns the count.
  std::size_t read(char* dst, std::size_t n);
  // Appends up to n bytes to out; fewer only at the end of the stream. Returns the count.
  std::size_t read_append(std::string& out, std::size_t n);
  // The buffered bytes at the current position, refilling the buffer first if it is empty; an
  // empty view means end of stream. Use with consume() to scan without copying.
  std::string_view peek();
  // Advances past n bytes of the view peek() returned.
  void consume(std::size_t n);

  // Byte offset of the next byte in the (uncompressed) stream.
  std::uint64_t position() const { return position_; }
  // Continues at an uncompressed byte offset. Uncompressed files seek directly; compressed ones
  // decompress forward from the current position, or from the start of the file when going back.
  // IoError if the stream is shorter than `offset`.
  void seek(std::uint64_t offset);

  const std::string& path() const { return path_; }
  Compression compression() const { return compression_; }

 private:
  struct Zlib;
  bool fill();        // refills buf_ when empty; false at end of stream
  bool fill_input();  // refills the compressed input buffer; false at end of file
  void rewind();      // back to byte 0 of the file
  void skip(std::uint64_t n);

  std::string path_;
  Compression compression_;
  int fd_ = -1;
  std::unique_ptr<char[]> buf_;  // uncompressed bytes [pos_, len_) are unread
  std::size_t cap_;
  std::size_t pos_ = 0;
  std::size_t len_ = 0;
  std::uint64_t position_ = 0;     // uncompressed offset of buf_[pos_]
  std::uint64_t file_offset_ = 0;  // bytes read from the file so far
  bool eof_ = false;
  std::unique_ptr<Zlib> z_;  // only when compressed
};

// Writes a TFRecord file. Bytes go to "<path>.tmp.<pid>" in the same directory; close() finishes
// the compressed stream, fsyncs, renames the temporary over `path` and fsyncs the directory, so a
// crash or an error never leaves a half-written file under `path`. Every write is checked
// (ENOSPC, EDQUOT, EFBIG incl. RLIMIT_FSIZE, ...): an IoError names the path and the byte offset.
// After an error the writer is unusable. Destroying a writer that was not closed discards its
// temporary file: call close() to keep the records.
class TfRecordWriter {
 public:
  explicit TfRecordWriter(std::string path, Compression compression = Compression::None);
  ~TfRecordWriter();
  TfRecordWriter(const TfRecordWriter&) = delete;
  TfRecordWriter& operator=(const TfRecordWriter&) = delete;
  TfRecordWriter(TfRecordWriter&&) noexcept;
  TfRecordWriter& operator=(TfRecordWriter&&) noexcept;  // discards this writer's unclosed file

  void write(std::string_view record);
  // Commits the file (see above). A second close() does nothing.
  void close();
  // Uncompressed bytes written so far: the offset at which the next record starts.
  std::uint64_t offset() const;
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads a TFRecord file record by record through an InputStream (streaming, bounded memory).
//
// Recovery after an error thrown by next():
//  - data CRC mismatch: the length was valid, so the reader is already positioned at the next
//    record; calling next() again continues with it (the bad record is skipped, `record` is left
//    empty).
//  - length CRC mismatch or truncated record: record boundaries can no longer be trusted (the
//    stream cannot be resynchronized), so every later next() returns false as at end of file.
//  - read errors and corrupt compressed data: likewise, the reader reports end of file afterwards.
class TfRecordReader {
 public:
  explicit TfRecordReader(std::string path, Compression compression = Compression::None,
                          bool verify_crc = true);

  // The next record's data into `record`; false at a clean end of file (the end of the file falls
  // exactly on a record boundary).
  bool next(std::string& record);
  // Uncompressed byte offset of the next record: save it in a checkpoint, seek() to it later.
  std::uint64_t offset() const { return in_.position(); }
  // Resumes at an offset previously returned by offset() (a record boundary; anything else is
  // detected as a length CRC mismatch by the next next()). Clears the end-of-file/error state.
  // Compressed files decompress from the start (or forward) and skip; IoError past the end.
  void seek(std::uint64_t offset);

  const std::string& path() const { return in_.path(); }

 private:
  InputStream in_;
  bool verify_crc_;
  bool done_ = false;
};

// Convenience: all records of a file (small files and tests).
std::vector<std::string> read_tfrecord_file(const std::string& path,
                                            Compression compression = Compression::None);

}  // namespace hpm::io
