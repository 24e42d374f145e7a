// `hpm data tokenizer train|encode|decode`: SentencePiece tokenizers and token shards.
//   hpm data tokenizer train --files GLOB --vocab-size N --output PREFIX [--model-type unigram|bpe]
//       PREFIX.model and PREFIX.vocab, learned from each file's training part (the first 90%)
//   hpm data tokenizer encode [--model M.model] --files GLOB -o DIR [--shard-tokens N]
//       DIR/train-00000.tokens ... and DIR/val-00000.tokens ...: the files split 90/10 as
//       [data] source = "text" splits them, encoded (bytes without --model)
//   hpm data tokenizer encode [--model M.model] TEXT       the ids, on one line
//   hpm data tokenizer decode [--model M.model] [IDS...]   the text (ids from stdin if none)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hpm::cli {

struct TokenizerCommandOptions {
  std::string action;  // train | encode | decode
  std::string model;   // empty: bytes
  // train
  std::string files = "/usr/share/games/fortunes/*";
  std::string output;
  std::int64_t vocab_size = 4096;
  std::string model_type = "unigram";
  bool no_byte_fallback = false;
  int threads = 1;
  // encode
  std::string text;
  bool has_files = false;
  std::int64_t shard_tokens = 1 << 26;
  // decode
  std::vector<std::int64_t> ids;
};

// Adds `tokenizer` and its subcommands under `data`; returns the `tokenizer` command.
CLI::App* add_tokenizer_command(CLI::App& data, TokenizerCommandOptions& options);
int run_tokenizer_command(const TokenizerCommandOptions& options);

}  // namespace hpm::cli
