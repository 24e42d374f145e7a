#include "hpm/data/text_corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "hpm/data/file_sources.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::data {

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot open: " + std::string(std::strerror(errno)));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Tensor tokens_of(const std::vector<std::int64_t>& ids) {
  return Tensor::from_i64(ids, Shape{static_cast<std::int64_t>(ids.size())});
}

void check_window(const TokenSequence& tokens, std::int64_t block, std::int64_t batch,
                  const char* what) {
  if (block < 1 || batch < 1) {
    throw std::invalid_argument(std::string(what) + ": block and batch must be positive, got " +
                                std::to_string(block) + " and " + std::to_string(batch));
  }
  if (tokens.size() < block + 2) {
    throw std::invalid_argument(std::string(what) + ": a block of " + std::to_string(block) +
                                " tokens needs windows of " + std::to_string(block + 1) +
                                ", and the split holds only " + std::to_string(tokens.size()) +
                                " tokens");
  }
}

// Rows `starts` of the windows into (inputs, targets).
Element windows_at(const TokenSequence& tokens, const std::vector<std::int64_t>& starts,
                   std::int64_t block) {
  const auto rows = static_cast<std::int64_t>(starts.size());
  Tensor x = Tensor::empty({rows, block}, DType::I64), y = Tensor::empty({rows, block}, DType::I64);
  std::vector<std::int64_t> window(static_cast<std::size_t>(block + 1));
  for (std::int64_t r = 0; r < rows; ++r) {
    tokens.read(starts[static_cast<std::size_t>(r)], block + 1, window.data());
    std::copy(window.begin(), window.end() - 1, x.data<std::int64_t>() + r * block);
    std::copy(window.begin() + 1, window.end(), y.data<std::int64_t>() + r * block);
  }
  return {x, y};
}

}  // namespace

std::vector<std::string> text_corpus_files(const std::string& pattern) {
  std::vector<std::string> files;
  for (const std::string& path : glob_paths(pattern)) {
    struct stat st {};
    // torch_gpt.py's rule: regular files only (no links, no directories), no ".dat" indexes.
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".dat") == 0) continue;
    files.push_back(path);
  }
  if (files.empty()) {
    throw DataError(pattern, "no regular text file matches (symbolic links and .dat skipped)");
  }
  return files;
}

std::pair<std::string, std::string> split_text_file(const std::string& path, double train_fraction,
                                                    bool utf8) {
  if (!(train_fraction > 0.0 && train_fraction < 1.0)) {
    throw std::invalid_argument("split_text_file: train_fraction must be in (0, 1), got " +
                                std::to_string(train_fraction));
  }
  std::string bytes = read_bytes(path);
  if (bytes.empty()) throw DataError(path, "empty file: no text to learn from");
  if (const auto nul = bytes.find('\0'); nul != std::string::npos) {
    throw DataError(path,
                    "a NUL byte at offset " + std::to_string(nul) + ": a binary file, not text");
  }
  // In integers, as torch_gpt.py's len * 9 // 10: a double product can land just below a whole
  // number and move the cut by a byte.
  const auto millionths = static_cast<std::uint64_t>(std::llround(train_fraction * 1e6));
  auto cut = static_cast<std::size_t>(bytes.size() * millionths / 1000000);
  // A continuation byte (10xxxxxx) is inside a character: cut before the character instead.
  while (utf8 && cut > 0 && cut < bytes.size() &&
         (static_cast<unsigned char>(bytes[cut]) & 0xC0) == 0x80)
    --cut;
  std::string val = bytes.substr(cut);
  bytes.resize(cut);
  return {std::move(bytes), std::move(val)};
}

TextCorpus load_text_corpus(const std::string& pattern, double train_fraction) {
  return load_text_corpus(pattern, *byte_tokenizer(), train_fraction);
}

TextCorpus load_text_corpus(const std::string& pattern, const Tokenizer& tokenizer,
                            double train_fraction) {
  if (!(train_fraction > 0.0 && train_fraction < 1.0)) {
    throw std::invalid_argument("load_text_corpus: train_fraction must be in (0, 1), got " +
                                std::to_string(train_fraction));
  }
  TextCorpus c;
  c.files = text_corpus_files(pattern);
  c.vocab_size = tokenizer.vocab_size();
  const bool bytes = tokenizer.fingerprint() == 0;
  std::vector<std::int64_t> train, val;
  for (const std::string& path : c.files) {
    const auto [head, tail] = split_text_file(path, train_fraction, !bytes);
    const std::vector<std::int64_t> a = tokenizer.encode(head, path),
                                    b = tokenizer.encode(tail, path, head.size());
    train.insert(train.end(), a.begin(), a.end());
    val.insert(val.end(), b.begin(), b.end());
  }
  c.train = tokens_of(train);
  c.val = tokens_of(val);
  return c;
}

Dataset random_windows(TokenSequence tokens, std::int64_t block, std::int64_t batch,
                       std::uint64_t seed, std::int64_t steps) {
  check_window(tokens, block, batch, "random_windows");
  return Dataset::from_epoch_generator(
      [tokens, block, batch, seed, steps](std::int64_t epoch, std::int64_t k, Element& out) {
        if (steps != kInfinite && k >= steps) return false;
        // Step k of pass e is the (e * steps + k)-th draw: passes continue the stream.
        const std::int64_t draw = steps == kInfinite ? k : epoch * steps + k;
        Generator gen(seed * 1000003ULL + static_cast<std::uint64_t>(draw));
        const auto span = static_cast<std::uint64_t>(tokens.size() - block - 1);
        std::vector<std::int64_t> starts(static_cast<std::size_t>(batch));
        for (auto& s : starts) s = static_cast<std::int64_t>(gen.below(span));
        out = windows_at(tokens, starts, block);
        return true;
      },
      steps == kInfinite ? kInfinite : steps);
}

Dataset sequential_windows(TokenSequence tokens, std::int64_t block, std::int64_t batch) {
  check_window(tokens, block, batch, "sequential_windows");
  const std::int64_t windows = (tokens.size() - 1) / block;
  const std::int64_t elements = (windows + batch - 1) / batch;
  return Dataset::from_generator(
      [tokens, block, batch, windows](std::int64_t k, Element& out) {
        if (k * batch >= windows) return false;
        std::vector<std::int64_t> starts;
        for (std::int64_t w = k * batch; w < std::min(windows, (k + 1) * batch); ++w)
          starts.push_back(w * block);
        out = windows_at(tokens, starts, block);
        return true;
      },
      elements);
}

LabelledData validation_windows(TokenSequence tokens, std::int64_t block, std::int64_t batch,
                                std::int64_t max_batches) {
  check_window(tokens, block, batch, "validation_windows");
  const std::int64_t windows = (tokens.size() - 1) / block;
  if (max_batches > 0 && max_batches * batch < windows) {
    // Fewer windows than the sweep has: spread evenly over the whole split, window i of k at
    // floor(i * windows / k). The first k in order would measure the split's beginning alone
    // (in a corpus of files, its first files): fortunes' first 50 batches read 0.05 above the
    // whole split, where these read within its noise.
    const std::int64_t k = max_batches * batch;
    std::vector<std::int64_t> starts;
    starts.reserve(static_cast<std::size_t>(k));
    for (std::int64_t i = 0; i < k; ++i) starts.push_back(i * windows / k * block);
    Element e = windows_at(tokens, starts, block);
    return {e[0], e[1]};
  }
  auto it = sequential_windows(std::move(tokens), block, batch).make_iterator();
  std::vector<Tensor> inputs, targets;
  Element e;
  while ((max_batches == 0 || static_cast<std::int64_t>(inputs.size()) < max_batches) &&
         it->next(e)) {
    inputs.push_back(e[0]);
    targets.push_back(e[1]);
  }
  return {kernels::concat(inputs, 0), kernels::concat(targets, 0)};
}

}  // namespace hpm::data
