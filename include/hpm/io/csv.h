// Streaming readers for CSV files (RFC 4180, like tf.data.experimental.CsvDataset) and text lines
// (like tf.data.TextLineDataset). Both read through a buffered InputStream, optionally
// decompressing ZLIB/GZIP, and never hold more than a row or line plus the buffers in memory.
//
// CSV rules:
//  - Records end at "\n" or "\r\n"; a final record without a line ending is read too. Lines that
//    are completely empty are skipped. A UTF-8 byte order mark at the start is ignored.
//  - A field that starts with '"' is quoted: it may hold delimiters, "\n", "\r\n" (kept as they
//    are) and doubled quotes ("" -> "); after its closing quote comes a delimiter or the end of the
//    record. A '"' inside an unquoted field is an error.
//  - With `header`, the first record names the columns (used in error messages and column()).
//  - Every record must have the same number of fields: types.size() if types are given, else the
//    header's (or the first record's) count.
//  - Conversion: F32 and I64 fields may be surrounded by spaces; they must be complete numbers
//    (from_chars; I64 in range). An empty field is a missing value; for String columns a quoted
//    empty field ("") is an empty string, not missing. A missing value takes the column's default
//    (converted like a field) or, without one, is an error.
// Errors are IoErrors of the form
//   "<path>: line 7, column 'price': expected a number, got 'abc'"
// where the line is the (1-based) line on which the record starts.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "hpm/io/error.h"
#include "hpm/io/tfrecord.h"

namespace hpm::io {

enum class ColumnType { F32, I64, String };

// F32 -> float, I64 -> std::int64_t, String -> std::string.
using CsvValue = std::variant<float, std::int64_t, std::string>;

struct CsvOptions {
  char delimiter = ',';
  bool header = true;
  // One type per column; empty: every column is a String.
  std::vector<ColumnType> types;
  // One entry per column (or empty: every column required); nullopt marks a required column.
  std::vector<std::optional<std::string>> defaults;
  Compression compression = Compression::None;
};

class CsvReader {
 public:
  CsvReader(std::string path, CsvOptions options = {});

  // The next record, converted; false at the end of the file.
  bool next(std::vector<CsvValue>& row);
  // The next record's raw fields without conversion or defaults (still checking the field count).
  bool next_fields(std::vector<std::string>& fields);
  // The line on which the last returned record started (1-based; 0 before the first).
  std::uint64_t line() const { return record_line_; }
  // The data records read so far, whether or not they converted (a resumed reader skips as many).
  std::uint64_t records() const { return records_; }
  // Reads past the next data record without checking it; false at the end of the file.
  bool skip_record();
  // Column names from the header (empty without a header).
  const std::vector<std::string>& column_names() const { return names_; }
  // The index of a named column; IoError if there is none.
  std::size_t column(const std::string& name) const;
  const std::string& path() const { return in_.path(); }

 private:
  // Splits the next record into fields_/quoted_; false at end of file.
  bool read_record();
  std::string column_label(std::size_t i) const;
  [[noreturn]] void fail(std::size_t column, const std::string& what) const;
  CsvValue convert(std::size_t column, const std::string& text, bool is_default) const;
  int get_char();   // the next byte, or -1 at end of file
  int peek_char();  // the next byte without consuming it, or -1

  InputStream in_;
  CsvOptions opt_;
  std::vector<std::string> names_;
  std::size_t columns_ = 0;  // 0 until known
  std::uint64_t next_line_ = 1;
  std::uint64_t record_line_ = 0;
  std::uint64_t records_ = 0;
  std::vector<std::string> fields_;
  std::vector<bool> quoted_;
  std::string_view view_;  // bytes of in_'s buffer being scanned; [0, vi_) already used
  std::size_t vi_ = 0;
};

class TextLineReader {
 public:
  explicit TextLineReader(std::string path, Compression compression = Compression::None);
  // The next line without its "\n" or "\r\n"; false at the end of the file. A last line without
  // a line ending is returned as well; an empty file has no lines.
  bool next(std::string& line);
  // 1-based number of the last returned line.
  std::uint64_t line() const { return line_; }
  const std::string& path() const { return in_.path(); }

 private:
  InputStream in_;
  std::uint64_t line_ = 0;
};

}  // namespace hpm::io
