#include "hpm/io/example.h"

#include <bit>
#include <cstring>
#include <set>

namespace hpm::io {
namespace {

enum WireType : unsigned {
  kVarint = 0,
  kFixed64 = 1,
  kLen = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5
};

const char* wire_type_name(unsigned wt) {
  switch (wt) {
    case kVarint:
      return "0 (varint)";
    case kFixed64:
      return "1 (64-bit)";
    case kLen:
      return "2 (length-delimited)";
    case kStartGroup:
      return "3 (start group)";
    case kEndGroup:
      return "4 (end group)";
    case kFixed32:
      return "5 (32-bit)";
  }
  return "invalid";
}

// -- encoding ---------------------------------------------------------------------------------

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, unsigned field, unsigned wt) { put_varint(out, (field << 3) | wt); }

void put_len(std::string& out, unsigned field, std::string_view payload) {
  put_tag(out, field, kLen);
  put_varint(out, payload.size());
  out.append(payload);
}

std::size_t varint_size(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

std::string encode_feature(const Feature& f) {
  std::string list;
  switch (f.kind) {
    case Feature::None:
      return {};
    case Feature::Bytes:
      for (const auto& b : f.bytes) put_len(list, 1, b);
      break;
    case Feature::Float:
      if (!f.floats.empty()) {
        put_tag(list, 1, kLen);
        put_varint(list, f.floats.size() * 4);
        for (float x : f.floats) {
          const auto bits = std::bit_cast<std::uint32_t>(x);
          for (int i = 0; i < 4; ++i) list.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
        }
      }
      break;
    case Feature::Int64:
      if (!f.ints.empty()) {
        std::size_t n = 0;
        for (auto v : f.ints) n += varint_size(static_cast<std::uint64_t>(v));
        put_tag(list, 1, kLen);
        put_varint(list, n);
        for (auto v : f.ints) put_varint(list, static_cast<std::uint64_t>(v));
      }
      break;
  }
  std::string out;
  put_len(out, static_cast<unsigned>(f.kind), list);  // Bytes=1, Float=2, Int64=3
  return out;
}

// -- decoding ---------------------------------------------------------------------------------

class Decoder {
 public:
  Decoder(std::string_view data, const std::string& where) : d_(data), where_(where) {}

  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    throw IoError(where_ + ": invalid tf.train.Example at byte " + std::to_string(at) + ": " +
                  what);
  }

  std::uint64_t varint(std::size_t& pos, std::size_t end, const char* what) const {
    const std::size_t start = pos;
    std::uint64_t v = 0;
    for (int i = 0; i < 10; ++i) {
      if (pos >= end) {
        fail(start, std::string("truncated varint (") + what + "): the message ends at byte " +
                        std::to_string(end));
      }
      const auto b = static_cast<unsigned char>(d_[pos++]);
      v |= static_cast<std::uint64_t>(b & 0x7F) << (7 * i);
      if (!(b & 0x80)) return v;
    }
    fail(start, std::string("varint (") + what + ") longer than 10 bytes");
  }

  // Reads a tag; returns false at `end`.
  bool tag(std::size_t& pos, std::size_t end, unsigned& field, unsigned& wt,
           std::size_t& tag_at) const {
    if (pos >= end) return false;
    tag_at = pos;
    const std::uint64_t key = varint(pos, end, "field tag");
    wt = static_cast<unsigned>(key & 7);
    const std::uint64_t f = key >> 3;
    if (f == 0 || f > 0x1FFFFFFF) fail(tag_at, "invalid field number " + std::to_string(f));
    if (wt > kFixed32) fail(tag_at, "invalid wire type " + std::to_string(wt));
    field = static_cast<unsigned>(f);
    return true;
  }

  // The payload range of a length-delimited field whose length starts at pos.
  std::size_t len(std::size_t& pos, std::size_t end, const char* what) const {
    const std::size_t at = pos;
    const std::uint64_t n = varint(pos, end, what);
    if (n > end - pos) {
      fail(at, std::string("length ") + std::to_string(n) + " of " + what +
                   " runs past the end of its enclosing message (expected at most " +
                   std::to_string(end - pos) + " bytes)");
    }
    return static_cast<std::size_t>(n);
  }

  void expect_wt(unsigned wt, unsigned expected, std::size_t at, const char* field) const {
    if (wt != expected) {
      fail(at, std::string(field) + ": expected wire type " + wire_type_name(expected) +
                   ", found " + wire_type_name(wt));
    }
  }

  void skip(unsigned wt, std::size_t& pos, std::size_t end, std::size_t tag_at) const {
    switch (wt) {
      case kVarint:
        varint(pos, end, "unknown field");
        return;
      case kFixed64:
      case kFixed32: {
        const std::size_t n = wt == kFixed64 ? 8 : 4;
        if (end - pos < n) {
          fail(pos, "truncated " + std::to_string(n * 8) + "-bit field: expected " +
                        std::to_string(n) + " bytes, found " + std::to_string(end - pos));
        }
        pos += n;
        return;
      }
      case kLen:
        pos += len(pos, end, "unknown field");
        return;
      default:
        fail(tag_at, std::string("unsupported wire type ") + wire_type_name(wt) +
                         " (groups are not part of tf.train.Example)");
    }
  }

  void example(Example& out) const {
    std::size_t pos = 0;
    const std::size_t end = d_.size();
    unsigned field = 0, wt = 0;
    std::size_t at = 0;
    while (tag(pos, end, field, wt, at)) {
      if (field == 1) {
        expect_wt(wt, kLen, at, "Example.features");
        const std::size_t n = len(pos, end, "Example.features");
        features(pos, pos + n, out);
        pos += n;
      } else {
        skip(wt, pos, end, at);
      }
    }
  }

  void features(std::size_t pos, std::size_t end, Example& out) const {
    unsigned field = 0, wt = 0;
    std::size_t at = 0;
    while (tag(pos, end, field, wt, at)) {
      if (field == 1) {
        expect_wt(wt, kLen, at, "Features.feature");
        const std::size_t n = len(pos, end, "Features.feature entry");
        entry(pos, pos + n, out);
        pos += n;
      } else {
        skip(wt, pos, end, at);
      }
    }
  }

  void entry(std::size_t pos, std::size_t end, Example& out) const {
    std::string key;
    Feature value;
    unsigned field = 0, wt = 0;
    std::size_t at = 0;
    while (tag(pos, end, field, wt, at)) {
      if (field == 1) {
        expect_wt(wt, kLen, at, "feature map key");
        const std::size_t n = len(pos, end, "feature map key");
        key.assign(d_.substr(pos, n));
        pos += n;
      } else if (field == 2) {
        expect_wt(wt, kLen, at, "feature map value");
        const std::size_t n = len(pos, end, "feature map value");
        feature(pos, pos + n, value);
        pos += n;
      } else {
        skip(wt, pos, end, at);
      }
    }
    out[key] = std::move(value);
  }

  void feature(std::size_t pos, std::size_t end, Feature& f) const {
    unsigned field = 0, wt = 0;
    std::size_t at = 0;
    while (tag(pos, end, field, wt, at)) {
      if (field < 1 || field > 3) {
        skip(wt, pos, end, at);
        continue;
      }
      static const char* const names[] = {"", "Feature.bytes_list", "Feature.float_list",
                                          "Feature.int64_list"};
      expect_wt(wt, kLen, at, names[field]);
      const std::size_t n = len(pos, end, names[field]);
      const auto kind = static_cast<Feature::Kind>(field);
      if (f.kind != kind) f = Feature{kind, {}, {}, {}};  // another oneof member: last one wins
      list(pos, pos + n, f);
      pos += n;
    }
  }

  void list(std::size_t pos, std::size_t end, Feature& f) const {
    unsigned field = 0, wt = 0;
    std::size_t at = 0;
    while (tag(pos, end, field, wt, at)) {
      if (field != 1) {
        skip(wt, pos, end, at);
        continue;
      }
      switch (f.kind) {
        case Feature::Bytes: {
          expect_wt(wt, kLen, at, "BytesList.value");
          const std::size_t n = len(pos, end, "BytesList.value");
          f.bytes.emplace_back(d_.substr(pos, n));
          pos += n;
          break;
        }
        case Feature::Float:
          if (wt == kLen) {
            const std::size_t n = len(pos, end, "FloatList.value (packed)");
            if (n % 4 != 0) {
              fail(at, "packed FloatList.value of " + std::to_string(n) +
                           " bytes: expected a multiple of 4");
            }
            for (std::size_t i = 0; i < n; i += 4) f.floats.push_back(float_at(pos + i));
            pos += n;
          } else {
            expect_wt(wt, kFixed32, at, "FloatList.value");
            if (end - pos < 4) {
              fail(pos, "truncated float: expected 4 bytes, found " + std::to_string(end - pos));
            }
            f.floats.push_back(float_at(pos));
            pos += 4;
          }
          break;
        case Feature::Int64:
          if (wt == kLen) {
            const std::size_t n = len(pos, end, "Int64List.value (packed)");
            const std::size_t stop = pos + n;
            while (pos < stop) {
              f.ints.push_back(static_cast<std::int64_t>(varint(pos, stop, "packed int64")));
            }
          } else {
            expect_wt(wt, kVarint, at, "Int64List.value");
            f.ints.push_back(static_cast<std::int64_t>(varint(pos, end, "int64")));
          }
          break;
        case Feature::None:
          break;
      }
    }
  }

 private:
  float float_at(std::size_t pos) const {
    std::uint32_t bits = 0;
    for (int i = 3; i >= 0; --i) {
      bits = (bits << 8) | static_cast<unsigned char>(d_[pos + static_cast<std::size_t>(i)]);
    }
    return std::bit_cast<float>(bits);
  }

  std::string_view d_;
  const std::string& where_;
};

// -- parse_example ----------------------------------------------------------------------------

std::int64_t checked_numel(const Shape& shape, const std::string& where, const std::string& key) {
  for (auto d : shape.dims()) {
    if (d < 0) {
      throw IoError(where + ": feature '" + key + "': invalid shape " + shape.str() +
                    " (dimensions must be known and non-negative)");
    }
  }
  return shape.numel();
}

Tensor values_tensor(const Feature& f, Feature::Kind kind, std::size_t count, const Shape& shape) {
  if (kind == Feature::Float) {
    Tensor t = Tensor::empty(shape, DType::F32);
    if (count) std::memcpy(t.data<float>(), f.floats.data(), count * sizeof(float));
    return t;
  }
  Tensor t = Tensor::empty(shape, DType::I64);
  if (count) std::memcpy(t.data<std::int64_t>(), f.ints.data(), count * sizeof(std::int64_t));
  return t;
}

void check_kind(const Feature& f, Feature::Kind kind, const std::string& where,
                const std::string& key) {
  if (f.kind != Feature::None && f.kind != kind) {
    throw IoError(where + ": feature '" + key + "': expected " + feature_kind_name(kind) +
                  ", found " + feature_kind_name(f.kind));
  }
}

Tensor parse_fixed(const Example& ex, const FixedLenFeature& spec, const std::string& where) {
  const std::int64_t numel = checked_numel(spec.shape, where, spec.key);
  const auto it = ex.find(spec.key);
  const bool present = it != ex.end();
  if (!present && !spec.default_value) {
    throw IoError(where + ": feature '" + spec.key +
                  "' is required (no default value) but missing from the example");
  }
  const Feature& f = present ? it->second : *spec.default_value;
  const std::string source = present ? "" : " (default value)";
  check_kind(f, spec.kind, where, spec.key);

  if (spec.kind == Feature::Bytes) {
    if (numel != 1) {
      throw IoError(where + ": feature '" + spec.key +
                    "': bytes features can be parsed only as a " +
                    "single value (shape [] or [1]), not shape " + spec.shape.str() +
                    "; read the Example's bytes list directly");
    }
    if (f.bytes.size() != 1) {
      throw IoError(where + ": feature '" + spec.key + "'" + source + ": expected 1 bytes value, " +
                    "found " + std::to_string(f.bytes.size()));
    }
    const std::string& b = f.bytes[0];
    Tensor t = Tensor::empty(Shape{static_cast<std::int64_t>(b.size())}, DType::I8);
    if (!b.empty()) std::memcpy(t.raw_data(), b.data(), b.size());
    return t;
  }
  if (spec.kind != Feature::Float && spec.kind != Feature::Int64) {
    throw IoError(where + ": feature '" + spec.key + "': the spec's kind must be bytes_list, " +
                  "float_list or int64_list");
  }
  const std::size_t count = spec.kind == Feature::Float ? f.floats.size() : f.ints.size();
  if (static_cast<std::int64_t>(count) == numel)
    return values_tensor(f, spec.kind, count, spec.shape);
  if (!present && count == 1) {  // a scalar default fills the whole shape
    Tensor t = values_tensor(f, spec.kind, 0, spec.shape);
    if (spec.kind == Feature::Float) {
      std::fill_n(t.data<float>(), numel, f.floats[0]);
    } else {
      std::fill_n(t.data<std::int64_t>(), numel, f.ints[0]);
    }
    return t;
  }
  throw IoError(where + ": feature '" + spec.key + "'" + source + ": expected " +
                std::to_string(numel) + " values for shape " + spec.shape.str() + ", found " +
                std::to_string(count));
}

Tensor parse_var(const Example& ex, const VarLenFeature& spec, const std::string& where) {
  if (spec.kind != Feature::Float && spec.kind != Feature::Int64) {
    throw IoError(where + ": feature '" + spec.key + "': var-len features must be float_list or " +
                  "int64_list (read bytes lists from the Example directly)");
  }
  static const Feature kEmpty;
  const auto it = ex.find(spec.key);
  const Feature& f = it != ex.end() ? it->second : kEmpty;
  check_kind(f, spec.kind, where, spec.key);
  const std::size_t count = spec.kind == Feature::Float ? f.floats.size() : f.ints.size();
  if (!spec.pad_to) {
    return values_tensor(f, spec.kind, count, Shape{static_cast<std::int64_t>(count)});
  }
  const std::int64_t pad = *spec.pad_to;
  if (pad < 0) {
    throw IoError(where + ": feature '" + spec.key + "': invalid pad_to " + std::to_string(pad));
  }
  if (static_cast<std::int64_t>(count) > pad) {
    throw IoError(where + ": feature '" + spec.key + "': expected at most " + std::to_string(pad) +
                  " values (pad_to), found " + std::to_string(count));
  }
  Tensor t = values_tensor(f, spec.kind, count, Shape{pad});
  if (spec.kind == Feature::Float) {
    std::fill(t.data<float>() + count, t.data<float>() + pad, static_cast<float>(spec.pad_value));
  } else {
    std::fill(t.data<std::int64_t>() + count, t.data<std::int64_t>() + pad,
              static_cast<std::int64_t>(spec.pad_value));
  }
  return t;
}

}  // namespace

std::size_t Feature::size() const {
  switch (kind) {
    case Bytes:
      return bytes.size();
    case Float:
      return floats.size();
    case Int64:
      return ints.size();
    case None:
      break;
  }
  return 0;
}

bool Feature::operator==(const Feature& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case Bytes:
      return bytes == o.bytes;
    case Float:
      return floats.size() == o.floats.size() &&
             (floats.empty() ||
              std::memcmp(floats.data(), o.floats.data(), floats.size() * sizeof(float)) == 0);
    case Int64:
      return ints == o.ints;
    case None:
      break;
  }
  return true;
}

const char* feature_kind_name(Feature::Kind k) {
  switch (k) {
    case Feature::Bytes:
      return "bytes_list";
    case Feature::Float:
      return "float_list";
    case Feature::Int64:
      return "int64_list";
    case Feature::None:
      break;
  }
  return "none";
}

std::string encode_example(const Example& example) {
  std::string features;
  for (const auto& [key, feature] : example) {
    std::string entry;
    put_len(entry, 1, key);
    put_len(entry, 2, encode_feature(feature));
    put_len(features, 1, entry);
  }
  std::string out;
  if (!example.empty()) put_len(out, 1, features);
  return out;
}

Example decode_example(std::string_view bytes, const std::string& where_for_errors) {
  Example out;
  Decoder(bytes, where_for_errors).example(out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> parse_example(const Example& example,
                                                          const std::vector<FeatureSpec>& specs,
                                                          const std::string& where_for_errors) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(specs.size());
  std::set<std::string> seen;
  for (const auto& spec : specs) {
    const std::string& key =
        std::visit([](const auto& s) -> const std::string& { return s.key; }, spec);
    if (!seen.insert(key).second) {
      throw IoError(where_for_errors + ": feature '" + key + "' appears twice in the spec");
    }
    if (const auto* fixed = std::get_if<FixedLenFeature>(&spec)) {
      out.emplace_back(key, parse_fixed(example, *fixed, where_for_errors));
    } else {
      out.emplace_back(key, parse_var(example, std::get<VarLenFeature>(spec), where_for_errors));
    }
  }
  return out;
}

}  // namespace hpm::io
