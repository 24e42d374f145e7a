#include "hpm/io/csv.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace hpm::io {
namespace {

std::string printable(const std::string& s) {
  constexpr std::size_t kMax = 40;
  std::string out(1, '\'');
  out.append(s, 0, kMax);
  if (s.size() <= kMax) {
    out.push_back('\'');
  } else {
    out.append("...' (");
    out.append(std::to_string(s.size()));
    out.append(" bytes)");
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string char_name(int c) {
  if (c == '\r') return "'\\r'";
  if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned>(c) & 0xFFu);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CsvReader

CsvReader::CsvReader(std::string path, CsvOptions options)
    : in_(std::move(path), options.compression), opt_(std::move(options)) {
  if (opt_.delimiter == '"' || opt_.delimiter == '\n' || opt_.delimiter == '\r') {
    throw IoError(in_.path() + ": invalid CSV delimiter " + char_name(opt_.delimiter));
  }
  if (!opt_.types.empty()) columns_ = opt_.types.size();
  if (!opt_.defaults.empty() && !opt_.types.empty() && opt_.defaults.size() != opt_.types.size()) {
    throw IoError(in_.path() + ": " + std::to_string(opt_.defaults.size()) +
                  " defaults given for " + std::to_string(opt_.types.size()) +
                  " column types (expected one per column)");
  }
  // Skip a UTF-8 byte order mark.
  const std::string_view head = in_.peek();
  if (head.size() >= 3 && head.substr(0, 3) == "\xEF\xBB\xBF") in_.consume(3);
  if (opt_.header && read_record()) {
    names_ = fields_;
    if (columns_ != 0 && names_.size() != columns_) {
      throw IoError(in_.path() + ": line " + std::to_string(record_line_) + ": the header has " +
                    std::to_string(names_.size()) + " columns, expected " +
                    std::to_string(columns_) + " (one per column type)");
    }
    columns_ = names_.size();
    record_line_ = 0;
  }
}

int CsvReader::get_char() {
  if (vi_ == view_.size()) {
    in_.consume(vi_);
    view_ = in_.peek();
    vi_ = 0;
    if (view_.empty()) return -1;
  }
  return static_cast<unsigned char>(view_[vi_++]);
}

int CsvReader::peek_char() {
  if (vi_ == view_.size()) {
    in_.consume(vi_);
    view_ = in_.peek();
    vi_ = 0;
    if (view_.empty()) return -1;
  }
  return static_cast<unsigned char>(view_[vi_]);
}

std::string CsvReader::column_label(std::size_t i) const {
  if (i < names_.size()) return "column '" + names_[i] + "'";
  return "column " + std::to_string(i + 1);
}

void CsvReader::fail(std::size_t column, const std::string& what) const {
  throw IoError(in_.path() + ": line " + std::to_string(record_line_) + ", " +
                column_label(column) + ": " + what);
}

std::size_t CsvReader::column(const std::string& name) const {
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return i;
  }
  throw IoError(in_.path() + ": no column '" + name + "' in the header");
}

bool CsvReader::read_record() {
  fields_.clear();
  quoted_.clear();
  // Skip empty lines; stop at the end of the file.
  for (;;) {
    const int c = peek_char();
    if (c == -1) return false;
    if (c == '\n') {
      get_char();
      ++next_line_;
      continue;
    }
    if (c == '\r') {
      get_char();
      if (peek_char() == '\n') {
        get_char();
        ++next_line_;
        continue;
      }
      fields_.emplace_back("\r");  // a lone CR is data
      quoted_.push_back(false);
      record_line_ = next_line_;
      break;
    }
    record_line_ = next_line_;
    fields_.emplace_back();
    quoted_.push_back(false);
    break;
  }
  enum {
    kStart,
    kUnquoted,
    kQuoted,
    kAfterQuote
  } state = fields_.back().empty() ? kStart : kUnquoted;
  const char delim = opt_.delimiter;
  const auto new_field = [&] {
    fields_.emplace_back();
    quoted_.push_back(false);
    state = kStart;
  };
  for (;;) {
    const int c = get_char();
    std::string& field = fields_.back();
    // Line endings and the end of the file finish the record outside quotes.
    if (state != kQuoted) {
      if (c == -1) return true;
      if (c == '\n') {
        ++next_line_;
        return true;
      }
      if (c == '\r' && peek_char() == '\n') {
        get_char();
        ++next_line_;
        return true;
      }
    }
    switch (state) {
      case kStart:
        if (c == '"') {
          quoted_.back() = true;
          state = kQuoted;
        } else if (c == delim) {
          new_field();
        } else {
          field.push_back(static_cast<char>(c));
          state = kUnquoted;
        }
        break;
      case kUnquoted:
        if (c == delim) {
          new_field();
        } else if (c == '"') {
          fail(fields_.size() - 1, "unexpected '\"' inside an unquoted field " + printable(field) +
                                       " (quote the whole field and double its quotes)");
        } else {
          field.push_back(static_cast<char>(c));
        }
        break;
      case kQuoted:
        if (c == -1) {
          fail(fields_.size() - 1,
               "unterminated quoted field: expected a closing '\"' before "
               "the end of the file");
        }
        if (c == '"') {
          if (peek_char() == '"') {
            get_char();
            field.push_back('"');
          } else {
            state = kAfterQuote;
          }
        } else {
          if (c == '\n') ++next_line_;
          field.push_back(static_cast<char>(c));
        }
        break;
      case kAfterQuote:
        if (c == delim) {
          new_field();
        } else {
          fail(fields_.size() - 1,
               "expected a delimiter or the end of the line after the "
               "closing quote, found " +
                   char_name(c));
        }
        break;
    }
  }
}

bool CsvReader::skip_record() {
  if (!read_record()) return false;
  ++records_;
  return true;
}

bool CsvReader::next_fields(std::vector<std::string>& fields) {
  if (!read_record()) return false;
  ++records_;  // consumed, whatever the checks below say of it
  if (columns_ == 0) columns_ = fields_.size();
  if (fields_.size() != columns_) {
    throw IoError(in_.path() + ": line " + std::to_string(record_line_) + ": expected " +
                  std::to_string(columns_) + " fields, found " + std::to_string(fields_.size()));
  }
  if (!opt_.defaults.empty() && opt_.defaults.size() != columns_) {
    throw IoError(in_.path() + ": " + std::to_string(opt_.defaults.size()) +
                  " defaults given for " + std::to_string(columns_) +
                  " columns (expected one per column)");
  }
  fields.swap(fields_);  // fields_ is refilled by the next read_record()
  return true;
}

CsvValue CsvReader::convert(std::size_t column, const std::string& text, bool is_default) const {
  const ColumnType type = opt_.types.empty() ? ColumnType::String : opt_.types[column];
  if (type == ColumnType::String) return text;
  const std::string prefix =
      is_default ? "missing value, and the column's default is invalid: " : "";
  std::string_view s = trim(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (type == ColumnType::F32) {
    float v = 0;
    const auto r = std::from_chars(b, e, v);
    if (r.ec == std::errc::result_out_of_range) {
      fail(column, prefix + "number " + printable(text) + " is out of range for float32");
    }
    if (s.empty() || r.ec != std::errc() || r.ptr != e) {
      fail(column, prefix + "expected a number, got " + printable(text));
    }
    return v;
  }
  std::int64_t v = 0;
  const auto r = std::from_chars(b, e, v);
  if (r.ec == std::errc::result_out_of_range) {
    fail(column, prefix + "integer " + printable(text) + " is out of range for int64");
  }
  if (s.empty() || r.ec != std::errc() || r.ptr != e) {
    fail(column, prefix + "expected an integer, got " + printable(text));
  }
  return v;
}

bool CsvReader::next(std::vector<CsvValue>& row) {
  std::vector<std::string> fields;
  if (!next_fields(fields)) return false;
  row.clear();
  row.reserve(fields.size());
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const ColumnType type = opt_.types.empty() ? ColumnType::String : opt_.types[i];
    // Strings: only an unquoted empty field is missing ("" is an empty string). Numbers: blank.
    const bool missing =
        type == ColumnType::String ? fields[i].empty() && !quoted_[i] : trim(fields[i]).empty();
    if (!missing) {
      row.push_back(convert(i, fields[i], false));
    } else if (!opt_.defaults.empty() && opt_.defaults[i]) {
      row.push_back(convert(i, *opt_.defaults[i], true));
    } else {
      fail(i, "missing value and the column has no default");
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// TextLineReader

TextLineReader::TextLineReader(std::string path, Compression compression)
    : in_(std::move(path), compression) {}

bool TextLineReader::next(std::string& line) {
  line.clear();
  bool any = false;
  for (;;) {
    const std::string_view v = in_.peek();
    if (v.empty()) {
      if (!any) return false;
      break;
    }
    any = true;
    const void* nl = std::memchr(v.data(), '\n', v.size());
    if (nl != nullptr) {
      const auto n = static_cast<std::size_t>(static_cast<const char*>(nl) - v.data());
      line.append(v.data(), n);
      in_.consume(n + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      break;
    }
    line.append(v.data(), v.size());
    in_.consume(v.size());
  }
  ++line_;
  return true;
}

}  // namespace hpm::io
