// The byte-level corpus and the language-modelling windows: torch_gpt.py's split (per file, 90%
// floor, file order, links and .dat skipped), windows whose targets are their inputs shifted by
// one, random windows that are a pure function of their index (exact resume), the deterministic
// validation sweep, and every documented error.
#include "hpm/data/text_corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "hpm/data/iterator_state.h"

namespace hpm::data {
namespace {

using hpm::testing::TempDir;

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string text_of(const Tensor& tokens) {
  std::string s;
  for (auto v : tokens.to_vector_i64()) s.push_back(static_cast<char>(v));
  return s;
}

TEST(TextCorpus, SplitsEachFileAsTorchGptDoes) {
  TempDir dir;
  write(dir / "b.txt", "0123456789abcdefghij");  // 20 bytes: 18 train, 2 val
  write(dir / "a.txt", "ABCDEFGHIJK");           // 11 bytes: floor(9.9) = 9 train, 2 val
  write(dir / "a.dat", "index");
  std::filesystem::create_symlink(dir / "a.txt", dir / "a.u8");
  const TextCorpus c = load_text_corpus(dir / "*");
  ASSERT_EQ(c.files.size(), 2u) << "links and .dat skipped";
  EXPECT_EQ(c.files[0], dir / "a.txt") << "sorted by name";
  EXPECT_EQ(text_of(c.train), "ABCDEFGHI0123456789abcdefgh");
  EXPECT_EQ(text_of(c.val), "JKij");
  EXPECT_EQ(c.vocab_size, 256);
}

TEST(TextCorpus, DocumentedErrorsNameWhatAndWhere) {
  TempDir dir;
  const auto error_of = [](const std::string& pattern) {
    try {
      load_text_corpus(pattern);
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(dir / "*.txt").find("no regular text file matches"), std::string::npos);
  write(dir / "empty.txt", "");
  EXPECT_NE(error_of(dir / "empty.txt").find("empty.txt: empty file"), std::string::npos);
  std::ofstream(dir / "bin.txt", std::ios::binary).write("ab\0cd", 5);
  EXPECT_NE(error_of(dir / "bin.txt").find("bin.txt: a NUL byte at offset 2"), std::string::npos);
  const Tensor short_split = Tensor::from_i64(std::vector<std::int64_t>{1, 2, 3, 4}, Shape{4});
  try {
    random_windows(short_split, 8, 2, 0);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a block of 8 tokens needs windows of 9, and the split "
                                         "holds only 4 tokens"),
              std::string::npos)
        << e.what();
  }
}

Tensor counting(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return Tensor::from_i64(v, Shape{n});
}

TEST(LanguageModelWindows, TargetsAreTheNextTokensAndRandomWindowsResumeExactly) {
  const Tensor tokens = counting(100);  // token i is i: a window's start is its first token
  const Dataset d = random_windows(tokens, 8, 4, 7, 6);
  auto it = d.make_iterator();
  std::vector<std::vector<std::int64_t>> firsts;
  Element e;
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(it->next(e));
    ASSERT_EQ(e[0].shape(), (Shape{4, 8}));
    const auto x = e[0].to_vector_i64(), y = e[1].to_vector_i64();
    for (std::size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(y[i], x[i] + 1);
      if (i % 8 == 0) {
        EXPECT_LT(x[i], 100 - 8 - 1);
      }
    }
    firsts.push_back(x);
  }
  StateWriter w;
  it->save(w);
  ASSERT_TRUE(it->next(e));
  const auto fourth = e[0].to_vector_i64();
  auto resumed = d.make_iterator();
  StateReader r(w.bytes());
  resumed->restore(r);
  ASSERT_TRUE(resumed->next(e));
  EXPECT_EQ(e[0].to_vector_i64(), fourth) << "resume continues at the saved step";
  auto again = d.make_iterator();
  ASSERT_TRUE(again->next(e));
  EXPECT_EQ(e[0].to_vector_i64(), firsts[0]) << "a pure function of the step";
  int n = 1;
  while (again->next(e)) ++n;
  EXPECT_EQ(n, 6);
}

TEST(LanguageModelWindows, ValidationSweepsEveryTokenOnce) {
  const Dataset d = sequential_windows(counting(30), 4, 3);  // windows at 0, 4, ..., 24: 7
  EXPECT_EQ(d.cardinality(), 3);
  auto it = d.make_iterator();
  Element e;
  std::vector<std::int64_t> predicted;
  while (it->next(e)) {
    const auto y = e[1].to_vector_i64();
    predicted.insert(predicted.end(), y.begin(), y.end());
  }
  ASSERT_EQ(predicted.size(), 28u);
  for (std::size_t i = 0; i < predicted.size(); ++i)
    EXPECT_EQ(predicted[i], static_cast<std::int64_t>(i + 1));
}

// An evaluation of fewer batches than the sweep holds takes windows spread over the whole split,
// not its beginning: 2 batches of 3 from 100 windows start at windows 0, 16, 33, 50, 66 and 83.
TEST(LanguageModelWindows, AShortEvaluationSpreadsItsWindowsOverTheSplit) {
  const LabelledData all = validation_windows(counting(401), 4, 3);
  EXPECT_EQ(all.size(), 100);
  const LabelledData some = validation_windows(counting(401), 4, 3, 2);
  ASSERT_EQ(some.size(), 6);
  const auto x = some.inputs.to_vector_i64();
  const std::vector<std::int64_t> first_tokens = {0, 64, 132, 200, 264, 332};
  for (std::size_t i = 0; i < first_tokens.size(); ++i) EXPECT_EQ(x[i * 4], first_tokens[i]) << i;
  const auto y = some.labels.to_vector_i64();
  EXPECT_EQ(y[4 * 5 + 3], 332 + 4);  // targets are the inputs shifted by one
  // As many batches as the sweep has, or more: the whole sweep, in order.
  EXPECT_EQ(validation_windows(counting(401), 4, 3, 34).size(), 100);
}

// Debian's fortunes, where installed (scripts/setup_peers.sh): torch_gpt.py's corpus.
TEST(TextCorpus, FortunesWhereInstalled) {
  if (!std::filesystem::exists("/usr/share/games/fortunes")) GTEST_SKIP() << "no fortunes package";
  const TextCorpus c = load_text_corpus("/usr/share/games/fortunes/*");
  EXPECT_GT(c.files.size(), 20u);
  EXPECT_GT(c.train.numel(), 8 * c.val.numel());
}

}  // namespace
}  // namespace hpm::data
