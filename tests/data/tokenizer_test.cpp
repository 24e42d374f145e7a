// Tokenizers: bytes, and SentencePiece models trained by hpm on Debian's fortunes (a few files, a
// small vocabulary, so training takes a fraction of a second). A trained model is lossless on the
// corpus, reproducible, gives the ids Debian's spm_encode gives for the same model file, and the
// corpus encoded with it splits as the byte corpus does; every documented error is named.
#include "hpm/data/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/errors.h"
#include "common/hpm_cli.h"
#include "common/temp_dir.h"
#include "hpm/data/text_corpus.h"

namespace hpm::data {
namespace {

// Decodes ids as bytes, an unfinished two-byte character at the end as U+FFFD: what
// SentencePiece's byte fallback gives for a character whose bytes are not all drawn yet.
class ReplacingBytes : public Tokenizer {
 public:
  std::vector<std::int64_t> encode(std::string_view, const std::string&,
                                   std::size_t) const override {
    return {};
  }
  std::string decode(const std::vector<std::int64_t>& ids) const override {
    std::string s;
    for (std::int64_t id : ids) s += static_cast<char>(id);
    if (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xE0) == 0xC0) {
      s.back() = '\xEF';
      s += "\xBF\xBD";
    }
    return s;
  }
  std::int64_t vocab_size() const override { return 256; }
  const std::string& name() const override { return name_; }
  std::uint32_t fingerprint() const override { return 1; }

 private:
  std::string name_ = "replacing bytes";
};

// The bytes of one character arrive one by one: nothing is shown until the character is whole;
// one left unfinished at the end shows as U+FFFD. Byte tokens pass through as they come.
TEST(IncrementalDecoder, HoldsBackACharacterUntilItIsWhole) {
  const ReplacingBytes tok;
  IncrementalDecoder d(tok);
  EXPECT_EQ(d.add('a'), "a");
  EXPECT_EQ(d.add(0xC3), "");
  EXPECT_EQ(d.add(0xA9), "\xC3\xA9");  // e-acute, whole
  EXPECT_EQ(d.add(0xC3), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.ids().size(), 4u);
  IncrementalDecoder bytes(*byte_tokenizer());
  EXPECT_EQ(bytes.add(0xC3) + bytes.add(0xA9) + bytes.finish(), "\xC3\xA9");
}

using hpm::testing::read_text;
using hpm::testing::run_shell;
using hpm::testing::TempDir;

const std::string kFortunes = "/usr/share/games/fortunes";

// Three fortune files (tabs, quotes, and a few characters outside ASCII), copied to dir/corpus.
std::string fortunes_subset(const TempDir& dir) {
  std::filesystem::create_directories(dir / "corpus");
  for (const char* name : {"goedel", "linux", "pets"})
    std::filesystem::copy_file(kFortunes + "/" + name, dir / ("corpus/" + std::string(name)));
  return dir / "corpus/*";
}

using hpm::testing::error_of;

#define SKIP_WITHOUT_FORTUNES()                       \
  if (!std::filesystem::exists(kFortunes + "/linux")) \
  GTEST_SKIP() << "no fortunes package (scripts/setup.sh installs it)"

TEST(ByteTokenizer, IdsAreTheBytes) {
  const auto t = byte_tokenizer();
  EXPECT_EQ(t->vocab_size(), 256);
  EXPECT_EQ(t->fingerprint(), 0u);
  const std::string text = "a\n\xc3\xa9";
  const std::vector<std::int64_t> ids = t->encode(text);
  EXPECT_EQ(ids, (std::vector<std::int64_t>{97, 10, 0xc3, 0xa9}));
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_NE(error_of([&] {
              t->decode({97, 256});
            }).find("token 256 (position 1) is outside the vocabulary of 256 tokens of bytes"),
            std::string::npos);
}

// The tests' models: 800 pieces, fast to train on three fortunes files.
SentencePieceOptions small_model(const char* type) {
  SentencePieceOptions o;
  o.vocab_size = 800;
  o.model_type = type;
  return o;
}

TEST(SentencePiece, TrainedModelIsLosslessOnFortunesAndReproducible) {
  SKIP_WITHOUT_FORTUNES();
  TempDir dir;
  const std::string corpus = fortunes_subset(dir);
  for (const char* type : {"unigram", "bpe"}) {
    SCOPED_TRACE(type);
    const SentencePieceOptions o = small_model(type);
    const TrainedTokenizer a = train_sentencepiece(corpus, dir / (std::string(type) + "/a/m"), o);
    EXPECT_EQ(a.vocab_size, 800);
    EXPECT_EQ(a.files, 3);
    EXPECT_GT(a.lines, 1000);
    EXPECT_TRUE(std::filesystem::exists(dir / (std::string(type) + "/a/m.vocab")));
    const auto tok = load_sentencepiece(a.model_path);
    EXPECT_EQ(tok->vocab_size(), 800);
    EXPECT_NE(tok->fingerprint(), 0u);
    // Lossless on every file, whole (the validation part too, which training never saw).
    for (const std::string& path : text_corpus_files(corpus)) {
      const std::string text = read_text(path);
      const std::vector<std::int64_t> ids = tok->encode(text, path);
      EXPECT_LT(ids.size(), text.size() * 2 / 3) << path << ": subwords, not bytes";
      EXPECT_EQ(tok->decode(ids), text) << path;
    }
    const std::string odd =
        "  two spaces,\ttabs\t\t, trailing space \n\n\ncaf\xc3\xa9 \xe2\x98\x83!\n";
    EXPECT_EQ(tok->decode(tok->encode(odd)), odd) << "whitespace, blank lines, bytes fallback";
    EXPECT_EQ(tok->encode("\n").size(), 1u) << "the newline is a piece of its own";
    // The same files and options, elsewhere: the same model file, byte for byte.
    const TrainedTokenizer b = train_sentencepiece(corpus, dir / (std::string(type) + "/b/m"), o);
    EXPECT_EQ(read_text(a.model_path), read_text(b.model_path));
  }
}

// Debian's spm_encode reads a file line by line; hpm's ids for the file are its ids for each line
// followed by the newline's id.
TEST(SentencePiece, SameIdsAsSpmEncode) {
  SKIP_WITHOUT_FORTUNES();
  if (run_shell("command -v spm_encode").code != 0)
    GTEST_SKIP() << "spm_encode missing (Debian's sentencepiece; scripts/setup.sh installs it)";
  TempDir dir;
  const std::string corpus = fortunes_subset(dir);
  for (const char* type : {"unigram", "bpe"}) {
    SCOPED_TRACE(type);
    const SentencePieceOptions o = small_model(type);
    const TrainedTokenizer m = train_sentencepiece(corpus, dir / type, o);
    const auto tok = load_sentencepiece(m.model_path);
    const std::int64_t newline = tok->encode("\n")[0];
    for (const char* name : {"goedel", "linux", "pets"}) {
      const std::string path = dir / ("corpus/" + std::string(name));
      const auto r = run_shell("spm_encode --model " + m.model_path + " --output_format=id < " +
                               path + " 2>/dev/null");
      ASSERT_EQ(r.code, 0) << r.output;
      std::vector<std::int64_t> expected;
      std::istringstream lines(r.output);
      for (std::string line; std::getline(lines, line);) {
        std::istringstream ids(line);
        for (std::int64_t id; ids >> id;) expected.push_back(id);
        expected.push_back(newline);
      }
      const std::string text = read_text(path);
      ASSERT_EQ(text.back(), '\n');
      EXPECT_EQ(tok->encode(text, path), expected) << name;
    }
  }
}

TEST(SentencePiece, CorpusSplitsAsTheByteCorpusAtCharacterBoundaries) {
  SKIP_WITHOUT_FORTUNES();
  TempDir dir;
  const std::string corpus = fortunes_subset(dir);
  const auto tok =
      load_sentencepiece(train_sentencepiece(corpus, dir / "m", small_model("unigram")).model_path);
  const TextCorpus bytes = load_text_corpus(corpus), pieces = load_text_corpus(corpus, *tok);
  EXPECT_EQ(pieces.vocab_size, 800);
  EXPECT_EQ(pieces.files, bytes.files);
  const auto text = [](const std::vector<std::int64_t>& ids) {
    std::string s;
    for (auto v : ids) s.push_back(static_cast<char>(v));
    return s;
  };
  // Whole files' texts: the parts' ids decode to the byte corpus' parts (no cut inside these
  // files' few multi-byte characters).
  EXPECT_EQ(tok->decode(pieces.train.to_vector_i64()), text(bytes.train.to_vector_i64()));
  EXPECT_EQ(tok->decode(pieces.val.to_vector_i64()), text(bytes.val.to_vector_i64()));
  // A cut that would fall inside a character moves back to its start.
  std::ofstream(dir / "e.txt") << "abcdefgh\xc3\xa9";  // 10 bytes: floor(0.9 * 10) = 9
  const auto [head, tail] = split_text_file(dir / "e.txt", 0.9, true);
  EXPECT_EQ(head, "abcdefgh");
  EXPECT_EQ(tail, "\xc3\xa9");
  EXPECT_EQ(split_text_file(dir / "e.txt", 0.9, false).first.size(), 9u) << "bytes: torch_gpt's";
}

TEST(SentencePiece, DocumentedErrorsNameWhatAndWhere) {
  SKIP_WITHOUT_FORTUNES();
  TempDir dir;
  const std::string corpus = fortunes_subset(dir);
  SentencePieceOptions o = small_model("unigram");
  o.byte_fallback = false;
  const auto strict = load_sentencepiece(train_sentencepiece(corpus, dir / "strict", o).model_path);
  // Characters the fortunes never use, without byte fallback: <unk>, refused with their places.
  EXPECT_NE(error_of([&] { strict->encode("ok \xe2\x98\x83 and \xe4\xb8\xad", "--prompt"); })
                .find("--prompt: characters outside the vocabulary of " + dir / "strict.model" +
                      ": '\xe2\x98\x83' (U+2603) at byte 3, '\xe4\xb8\xad' (U+4E2D) at byte 11 "
                      "(the model has no byte fallback, so they would be <unk>)"),
            std::string::npos);
  o.byte_fallback = true;
  const auto tok = load_sentencepiece(train_sentencepiece(corpus, dir / "m", o).model_path);
  EXPECT_NE(error_of([&] {
              tok->encode("abc\xff", "x.txt", 100);
            }).find("x.txt: byte 103: 0xff is not UTF-8"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              tok->decode({5, 800});
            }).find("token 800 (position 1) is outside the vocabulary of 800 tokens"),
            std::string::npos);
  std::ofstream(dir / "bad.model") << "not a model";
  EXPECT_NE(error_of([&] {
              load_sentencepiece(dir / "bad.model");
            }).find(dir / "bad.model: not a SentencePiece model"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_sentencepiece(dir / "none.model");
            }).find(dir / "none.model: cannot open"),
            std::string::npos);
  o.vocab_size = 100;  // fewer than the 256 bytes and the meta pieces
  EXPECT_NE(error_of([&] {
              train_sentencepiece(corpus, dir / "small", o);
            }).find("SentencePiece cannot train a unigram model of 100 pieces"),
            std::string::npos);
  std::ofstream(dir / "corpus/latin1", std::ios::binary) << "caf\xe9\n";
  EXPECT_NE(error_of([&] {
              train_sentencepiece(corpus, dir / "x", o);
            }).find("latin1: byte 3: not UTF-8"),
            std::string::npos);
  // In a corpus, the offset is the file's, also in its validation part.
  std::filesystem::remove(dir / "corpus/latin1");
  std::ofstream(dir / "corpus/zz", std::ios::binary) << std::string(100, 'a') << "\xff";
  EXPECT_NE(error_of([&] { load_text_corpus(corpus, *tok); }).find("zz: byte 100: 0xff"),
            std::string::npos);
}

TEST(Utf8, FirstInvalidByte) {
  EXPECT_EQ(first_invalid_utf8("plain \xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80"), std::string::npos);
  EXPECT_EQ(first_invalid_utf8("ab\x80"), 2u) << "a continuation byte alone";
  EXPECT_EQ(first_invalid_utf8("ab\xc3"), 2u) << "cut short";
  EXPECT_EQ(first_invalid_utf8("\xc0\xaf"), 0u) << "overlong";
  EXPECT_EQ(first_invalid_utf8("x\xed\xa0\x80"), 1u) << "a surrogate";
  EXPECT_EQ(first_invalid_utf8("\xf4\x90\x80\x80"), 0u) << "past U+10FFFF";
}

}  // namespace
}  // namespace hpm::data
