// The byte tokenizer and SentencePiece models (encoding and decoding; training is in
// sentencepiece_trainer.cpp).
#include "hpm/data/tokenizer.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "data/sentencepiece_loader.h"
#include "hpm/data/dataset.h"
#include "hpm/io/crc32c.h"

namespace hpm::data {

namespace {

void check_ids(const std::vector<std::int64_t>& ids, std::int64_t vocab, const std::string& name) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw std::out_of_range("token " + std::to_string(ids[i]) + " (position " +
                              std::to_string(i) + ") is outside the vocabulary of " +
                              std::to_string(vocab) + " tokens of " + name);
    }
  }
}

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<std::int64_t> encode(std::string_view text, const std::string&,
                                   std::size_t) const override {
    std::vector<std::int64_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<std::int64_t>& ids) const override {
    check_ids(ids, 256, name_);
    std::string s(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) s[i] = static_cast<char>(ids[i]);
    return s;
  }
  std::int64_t vocab_size() const override { return 256; }
  const std::string& name() const override { return name_; }
  std::uint32_t fingerprint() const override { return 0; }

 private:
  std::string name_ = "bytes";
};

// U+XXXX of the UTF-8 character at the start of `s` (valid UTF-8).
std::string code_point(std::string_view s) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  std::uint32_t cp = b(0);
  if (cp >= 0xF0) {
    cp = ((cp & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  } else if (cp >= 0xE0) {
    cp = ((cp & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  } else if (cp >= 0xC0) {
    cp = ((cp & 0x1F) << 6) | (b(1) & 0x3F);
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", cp);
  return buf;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw DataError(path, "cannot open the SentencePiece model");
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    try {
      sp_ = std::make_unique<spm::Model>(bytes);
    } catch (const std::runtime_error& e) {
      throw DataError(path, std::string("not a SentencePiece model: ") + e.what());
    }
    unk_ = sp_->unk_id();
    const std::uint32_t crc = io::crc32c(bytes.data(), bytes.size());
    fingerprint_ = crc == 0 ? 1 : crc;  // 0 means bytes
    // A model whose newline is a piece of its own and that adds nothing at the start of a line
    // (hpm's: no dummy prefix) encodes line by line, as spm_encode does. Whole, the same text can
    // come out differently where two segmentations score the same: the scores add up in another
    // order, and the rounding picks. Other models encode the text whole.
    const std::vector<int> newline = sp_->encode("\n"), probe = sp_->encode("a\na");
    by_line_ = newline.size() == 1 && newline[0] != unk_ && probe.size() == 3 &&
               probe[1] == newline[0] && probe[0] == probe[2];
    if (by_line_) newline_ = newline[0];
  }

  std::vector<std::int64_t> encode(std::string_view text, const std::string& origin,
                                   std::size_t offset) const override {
    if (const std::size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned char>(text[bad]));
      throw DataError(origin, "byte " + std::to_string(offset + bad) + ": " + buf +
                                  " is not UTF-8; SentencePiece (" + path_ +
                                  ") reads Unicode text and would replace it");
    }
    std::vector<std::int64_t> ids;
    if (!by_line_) {
      encode_into(text, origin, offset, ids);
      return ids;
    }
    for (std::size_t begin = 0; begin < text.size();) {
      std::size_t end = text.find('\n', begin);
      if (end == std::string_view::npos) end = text.size();
      encode_into(text.substr(begin, end - begin), origin, offset + begin, ids);
      if (end < text.size()) ids.push_back(newline_);
      begin = end + 1;
    }
    return ids;
  }

  std::string decode(const std::vector<std::int64_t>& ids) const override {
    check_ids(ids, vocab_size(), path_);
    try {
      return sp_->decode(std::vector<int>(ids.begin(), ids.end()));
    } catch (const std::runtime_error& e) {
      throw DataError(path_, std::string("cannot decode: ") + e.what());
    }
  }

  std::int64_t vocab_size() const override { return sp_->piece_size(); }
  const std::string& name() const override { return path_; }
  std::uint32_t fingerprint() const override { return fingerprint_; }

 private:
  // Names the characters that encode to <unk>, with their byte offsets (the first few).
  DataError unknown_characters(std::string_view text, const std::string& origin,
                               std::size_t offset) const {
    std::string list;
    int shown = 0, total = 0;
    for (const auto& [begin, end] : sp_->unknown_spans(text)) {
      ++total;
      if (shown == 5) continue;
      const std::string_view surface = text.substr(begin, end - begin);
      list += std::string(shown++ ? ", " : "") + "'" + std::string(surface) + "' (" +
              code_point(surface) + ") at byte " + std::to_string(offset + begin);
    }
    if (total > shown) list += " and " + std::to_string(total - shown) + " more";
    return DataError(origin, "characters outside the vocabulary of " + path_ + ": " + list +
                                 " (the model has no byte fallback, so they would be <unk>)");
  }

  // Appends the ids of `text` (UTF-8), refusing <unk>.
  void encode_into(std::string_view text, const std::string& origin, std::size_t offset,
                   std::vector<std::int64_t>& ids) const {
    std::vector<int> raw;
    try {
      raw = sp_->encode(text);
    } catch (const std::runtime_error& e) {
      throw DataError(origin, "SentencePiece (" + path_ + "): " + e.what());
    }
    for (const int id : raw) {
      if (id == unk_) throw unknown_characters(text, origin, offset);
      ids.push_back(id);
    }
  }

  std::string path_;
  std::unique_ptr<spm::Model> sp_;
  int unk_ = 0;
  std::uint32_t fingerprint_ = 1;
  bool by_line_ = false;
  std::int64_t newline_ = 0;
};

}  // namespace

std::shared_ptr<const Tokenizer> byte_tokenizer() {
  static const auto bytes = std::make_shared<const ByteTokenizer>();
  return bytes;
}

std::shared_ptr<const Tokenizer> load_sentencepiece(const std::string& model_path) {
  return std::make_shared<const SentencePieceTokenizer>(model_path);
}

std::size_t first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    std::uint32_t min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, min = 0x10000;
    } else {
      return i;  // a continuation byte, or 0xF8..0xFF
    }
    if (i + len > n) return i;
    std::uint32_t cp = c & (0x7F >> len);
    for (std::size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string IncrementalDecoder::add(std::int64_t id) {
  ids_.push_back(id);
  std::string text = tokenizer_.decode(ids_);
  static const std::string kReplacement = "\xEF\xBF\xBD";
  while (text.size() >= kReplacement.size() &&
         text.compare(text.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
    text.resize(text.size() - kReplacement.size());
  return advance(text);
}

std::string IncrementalDecoder::finish() { return advance(tokenizer_.decode(ids_)); }

std::string IncrementalDecoder::advance(const std::string& text) {
  if (text.size() <= shown_.size() || text.compare(0, shown_.size(), shown_) != 0) return "";
  std::string fresh = text.substr(shown_.size());
  shown_ = text;
  return fresh;
}

}  // namespace hpm::data
