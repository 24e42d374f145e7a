#include "hpm/cli/tokenizer_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "hpm/cli/options.h"
#include "hpm/cli/run_config.h"
#include "hpm/data/shard_encoding.h"
#include "hpm/data/tokenizer.h"

namespace hpm::cli {

namespace {

std::shared_ptr<const data::Tokenizer> tokenizer_of(const TokenizerCommandOptions& o) {
  return o.model.empty() ? data::byte_tokenizer() : data::load_sentencepiece(o.model);
}

int run_train(const TokenizerCommandOptions& o) {
  data::SentencePieceOptions so;
  so.vocab_size = o.vocab_size;
  so.model_type = o.model_type;
  so.byte_fallback = !o.no_byte_fallback;
  so.threads = o.threads;
  const data::TrainedTokenizer t = data::train_sentencepiece(o.files, o.output, so);
  std::printf(
      "hpm data tokenizer train: a %s model of %lld pieces from %lld files (their first 90%%: "
      "%lld lines, %lld bytes) in %.1f s: %s, %s\n",
      o.model_type.c_str(), static_cast<long long>(t.vocab_size), static_cast<long long>(t.files),
      static_cast<long long>(t.lines), static_cast<long long>(t.bytes), t.seconds,
      t.model_path.c_str(), t.vocab_path.c_str());
  return 0;
}

int run_encode(const TokenizerCommandOptions& o) {
  const auto tok = tokenizer_of(o);
  if (!o.has_files) {
    const std::vector<std::int64_t> ids = tok->encode(o.text, "TEXT");
    for (std::size_t i = 0; i < ids.size(); ++i)
      std::printf("%s%lld", i ? " " : "", static_cast<long long>(ids[i]));
    std::printf("\n");
    return 0;
  }
  data::EncodedCorpus c;
  try {
    c = data::encode_text_to_shards(o.files, *tok, o.output, o.shard_tokens);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("hpm data tokenizer encode: ") + e.what());
  }
  std::printf(
      "hpm data tokenizer encode: %zu files, %lld bytes -> %lld training and %lld validation "
      "tokens (%.2f bytes a token, vocabulary %lld of %s): %s/train-*.tokens (%zu), "
      "%s/val-*.tokens (%zu)\n",
      c.files, static_cast<long long>(c.bytes), static_cast<long long>(c.train_tokens),
      static_cast<long long>(c.val_tokens), c.bytes_per_token(),
      static_cast<long long>(tok->vocab_size()), tok->name().c_str(), o.output.c_str(),
      c.train_shards.size(), o.output.c_str(), c.val_shards.size());
  return 0;
}

int run_decode(const TokenizerCommandOptions& o) {
  const auto tok = tokenizer_of(o);
  std::vector<std::int64_t> ids = o.ids;
  if (ids.empty()) {  // from stdin: what `encode TEXT` prints
    std::string word;
    while (std::cin >> word) {
      try {
        std::size_t used = 0;
        ids.push_back(std::stoll(word, &used));
        if (used != word.size()) throw std::invalid_argument(word);
      } catch (const std::exception&) {
        throw ConfigError("hpm data tokenizer decode: standard input: \"" + word + "\" (id " +
                          std::to_string(ids.size()) + ") is not an integer");
      }
    }
  }
  const std::string text = tok->decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

CLI::App* add_tokenizer_command(CLI::App& data, TokenizerCommandOptions& o) {
  CLI::App* cmd =
      data.add_subcommand("tokenizer", "SentencePiece tokenizers: train, encode, decode");
  cmd->require_subcommand(1);
  CLI::App* train =
      cmd->add_subcommand("train", "learn a SentencePiece model from text files (their first 90%)");
  train->add_option("--files", o.files, "glob of text files (default: Debian's fortunes)");
  train->add_option("--vocab-size", o.vocab_size, "pieces in the vocabulary (4096)")
      ->check(CLI::Range(1, 1 << 30));
  train->add_option("--output", o.output, "writes PREFIX.model and PREFIX.vocab")->required();
  train->add_option("--model-type", o.model_type, "unigram (default) or bpe")
      ->check(CLI::IsMember({"unigram", "bpe"}));
  train->add_flag("--no-byte-fallback", o.no_byte_fallback,
                  "no byte pieces: characters outside the vocabulary are refused");
  train->add_option("--threads", o.threads, "trainer threads (1; the model depends on them)")
      ->check(CLI::Range(1, 1024));
  train->callback([&o] { o.action = "train"; });

  CLI::App* encode = cmd->add_subcommand(
      "encode", "text to ids: TEXT printed, or --files written as train/val token shards");
  encode->add_option("--model", o.model, "SentencePiece model (default: bytes, vocabulary 256)");
  CLI::Option* text = encode->add_option("text", o.text, "text to encode; its ids are printed");
  CLI::Option* files = encode->add_option(
      "--files", o.files, "glob of text files, split 90/10 per file as [data] source = \"text\"");
  CLI::Option* out =
      encode->add_option("-o,--output", o.output, "directory for the shards (with --files)");
  encode
      ->add_option("--shard-tokens", o.shard_tokens,
                   "tokens per shard at most (67108864: 128 MB of u16 ids)")
      ->check(positive_number());
  files->excludes(text)->needs(out);
  out->needs(files);
  encode->callback([&o, files, text] {
    if (!*files && !*text) throw CLI::RequiredError("TEXT or --files");
    o.has_files = static_cast<bool>(*files);
    o.action = "encode";
  });

  CLI::App* decode = cmd->add_subcommand("decode", "ids to text (ids from stdin when none given)");
  decode->add_option("--model", o.model, "SentencePiece model (default: bytes, vocabulary 256)");
  decode->add_option("ids", o.ids, "token ids");
  decode->callback([&o] { o.action = "decode"; });
  return cmd;
}

int run_tokenizer_command(const TokenizerCommandOptions& o) {
  if (o.action == "train") return run_train(o);
  if (o.action == "encode") return run_encode(o);
  return run_decode(o);
}

}  // namespace hpm::cli
