// Text files encoded once into token shards (`hpm data tokenizer encode --files`): each file split
// 90/10 as [data] source = "text" splits it, the splits' tokens written as DIR/train-00000.tokens,
// ... and DIR/val-00000.tokens, ..., which [data] source = "tokens" then reads without the
// tokenizer's cost.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hpm/data/tokenizer.h"
#include "hpm/tensor/tensor.h"

namespace hpm::data {

// `tokens` as shards of at most `per_shard` tokens, DIR/NAME-00000.tokens, ... (one, empty, for
// no tokens), stamped with the tokenizer's vocabulary and fingerprint. Returns their paths.
std::vector<std::string> write_token_shards(const std::string& dir, const std::string& name,
                                            const Tensor& tokens, std::int64_t per_shard,
                                            const Tokenizer& tokenizer);

struct EncodedCorpus {
  std::size_t files = 0;
  std::int64_t bytes = 0;  // of the text files
  std::int64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;
  double bytes_per_token() const {
    const std::int64_t t = train_tokens + val_tokens;
    return static_cast<double>(bytes) / static_cast<double>(t > 0 ? t : 1);
  }
};

// The files of `pattern` encoded into `dir` (made if missing). Refuses (std::invalid_argument
// naming one) a directory that already holds .tokens files: another run's shards would join this
// corpus through a glob.
EncodedCorpus encode_text_to_shards(const std::string& pattern, const Tokenizer& tokenizer,
                                    const std::string& dir, std::int64_t per_shard);

}  // namespace hpm::data
