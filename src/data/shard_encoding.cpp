#include "hpm/data/shard_encoding.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "hpm/data/text_corpus.h"
#include "hpm/data/token_shard.h"
#include "hpm/io/atomic_file.h"

namespace hpm::data {

std::vector<std::string> write_token_shards(const std::string& dir, const std::string& name,
                                            const Tensor& tokens, std::int64_t per_shard,
                                            const Tokenizer& tokenizer) {
  if (per_shard <= 0) throw std::invalid_argument("write_token_shards: per_shard must be > 0");
  const std::vector<std::int64_t> ids = tokens.to_vector_i64();
  std::vector<std::string> paths;
  for (std::size_t begin = 0; begin < ids.size() || paths.empty();
       begin += static_cast<std::size_t>(per_shard)) {
    const std::size_t end = std::min(ids.size(), begin + static_cast<std::size_t>(per_shard));
    char file[64];
    std::snprintf(file, sizeof file, "-%05zu.tokens", paths.size());
    paths.push_back(dir + "/" + name + file);
    write_token_shard(paths.back(),
                      std::vector<std::int64_t>(ids.begin() + static_cast<std::ptrdiff_t>(begin),
                                                ids.begin() + static_cast<std::ptrdiff_t>(end)),
                      tokenizer.vocab_size(), tokenizer.fingerprint());
  }
  return paths;
}

EncodedCorpus encode_text_to_shards(const std::string& pattern, const Tokenizer& tokenizer,
                                    const std::string& dir, std::int64_t per_shard) {
  if (std::filesystem::is_directory(dir)) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() == ".tokens") {
        throw std::invalid_argument(dir + " already holds token shards (" +
                                    e.path().filename().string() +
                                    "): remove them or write to another directory");
      }
    }
  }
  io::ensure_directory(dir);
  const TextCorpus c = load_text_corpus(pattern, tokenizer);
  EncodedCorpus out;
  out.files = c.files.size();
  for (const auto& f : c.files)
    out.bytes += static_cast<std::int64_t>(std::filesystem::file_size(f));
  out.train_tokens = c.train.numel();
  out.val_tokens = c.val.numel();
  out.train_shards = write_token_shards(dir, "train", c.train, per_shard, tokenizer);
  out.val_shards = write_token_shards(dir, "val", c.val, per_shard, tokenizer);
  return out;
}

}  // namespace hpm::data
