// Text for language models: a corpus split into training and validation tokens exactly as
// ../shared/peers/torch_gpt.py builds it (bytes, or the ids of a tokenizer), and the windows a
// language model trains on (random starts) and is evaluated on (a deterministic sweep).
//
//   TextCorpus c = load_text_corpus("/usr/share/games/fortunes/*");   // Debian's fortunes
//   Dataset train = random_windows(c.train, 64, 12, seed);     // (12, 64) inputs and targets
//   Dataset val = sequential_windows(c.val, 64, 12);
//
// Windows read a TokenSequence: the corpus' tensors, or memory-mapped token shards
// (token_shard.h).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hpm/data/dataset.h"
#include "hpm/data/in_memory.h"
#include "hpm/data/token_shard.h"
#include "hpm/data/tokenizer.h"

namespace hpm::data {

// Tokens are the files' bytes (vocabulary 256), or a tokenizer's ids, as I64.
struct TextCorpus {
  Tensor train, val;               // 1-D I64 token ids
  std::vector<std::string> files;  // in the order their tokens were concatenated
  std::int64_t vocab_size = 256;
};

// The regular files `pattern` (a glob) matches, symbolic links and names ending in ".dat"
// skipped, in sorted name order. Throws DataError naming the pattern when there are none.
std::vector<std::string> text_corpus_files(const std::string& pattern);

// One file of a corpus split in two, the first `train_fraction` for training. The cut is
// floor(train_fraction * size) bytes, torch_gpt.py's; with `utf8` it moves back to the start of
// the character it would split (a subword tokenizer reads characters). Throws DataError naming
// the file (and the byte offset) for an empty file or one holding a NUL byte (binary, not text).
std::pair<std::string, std::string> split_text_file(const std::string& path, double train_fraction,
                                                    bool utf8 = false);

// Every regular file `pattern` (a glob) matches, symbolic links and names ending in ".dat"
// skipped, in sorted name order; the first floor(train_fraction * size) bytes of each file go to
// training, the rest to validation, each split the concatenation of its parts in file order.
// Throws DataError naming the pattern when nothing is left to read, and naming the file (and
// the byte offset) for an empty file or one holding a NUL byte (binary, not text).
TextCorpus load_text_corpus(const std::string& pattern, double train_fraction = 0.9);

// The same files and split, each part encoded by `tokenizer` (the byte tokenizer gives exactly
// the corpus above; another cuts at a character boundary, split_text_file's `utf8`). Encoding
// errors name the file and the byte offset in it.
TextCorpus load_text_corpus(const std::string& pattern, const Tokenizer& tokenizer,
                            double train_fraction = 0.9);

// Language-modelling batches: element k is (inputs, targets), both (batch, block) I64, from
// `batch` windows of block + 1 tokens of `tokens` at starts uniform in [0, size - block - 1)
// drawn from (seed, k): inputs are a window's first block tokens, targets its last block. A pure
// function of k, so an iterator's state is its position and resuming repeats and skips nothing.
// `steps` elements a pass (kInfinite: endless); pass e continues with draws e * steps + k, so
// passes of a Trainer's epochs are one stream of fresh windows. Throws std::invalid_argument when
// the tokens cannot hold one window, naming both lengths.
Dataset random_windows(TokenSequence tokens, std::int64_t block, std::int64_t batch,
                       std::uint64_t seed, std::int64_t steps = kInfinite);

// The deterministic sweep for evaluation: consecutive windows of block + 1 tokens starting
// `block` apart from the beginning, `batch` to an element (the last may be smaller), every token
// of the split predicted once but the first.
Dataset sequential_windows(TokenSequence tokens, std::int64_t block, std::int64_t batch);

// That sweep as rows, inputs and targets (N, block): what a language model is evaluated on
// (train::Trainer::evaluate). With max_batches (0: all of it) smaller than the sweep,
// max_batches x batch of its windows spread evenly over the whole split (deterministic; the first
// ones alone would measure the split's beginning).
LabelledData validation_windows(TokenSequence tokens, std::int64_t block, std::int64_t batch,
                                std::int64_t max_batches = 0);

}  // namespace hpm::data
