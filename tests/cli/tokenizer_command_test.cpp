// Subword language models through the `hpm` binary (issue 16): `hpm data tokenizer train`,
// `encode` (printed ids, or train/val token shards) and `decode`; a GPT trained from a tokenizer
// config ([data] tokenizer with source "text") and from shards (source "tokens"); `hpm sample`
// with the tokenizer; and the bad input each is refused with: a vocabulary that does not match
// the model, a shard with a bad header or checksum, a prompt outside the tokenizer's vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/hpm_cli.h"
#include "hpm/data/text_corpus.h"
#include "hpm/data/token_shard.h"
#include "hpm/data/tokenizer.h"

namespace hpm {
namespace {

using namespace hpm::testing;

const std::string kFortunes = "/usr/share/games/fortunes";

#define SKIP_WITHOUT_FORTUNES()                       \
  if (!std::filesystem::exists(kFortunes + "/linux")) \
  GTEST_SKIP() << "no fortunes package (scripts/setup.sh installs it)"

// Three fortune files in dir/corpus; returns their glob.
std::string fortunes_subset(const TempDir& dir) {
  std::filesystem::create_directories(dir / "corpus");
  for (const char* name : {"goedel", "linux", "pets"})
    std::filesystem::copy_file(kFortunes + "/" + name, dir / ("corpus/" + std::string(name)));
  return dir / "corpus/*";
}

// `hpm data tokenizer train` of an 800-piece model at dir/NAME.model.
std::string train_tokenizer(const TempDir& dir, const std::string& corpus,
                            const std::string& name = "m", const std::string& extra = "") {
  const CommandResult r = run_hpm("data tokenizer train --files '" + corpus +
                                  "' --vocab-size 800 --output " + dir / name + " " + extra);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("a unigram model of 800 pieces from 3 files"), std::string::npos)
      << r.output;
  return dir / (name + ".model");
}

// A tiny GPT on `data` (the [data] lines), 20 steps, checkpoints in dir/ckpt.
std::string tokenizer_gpt_config(const TempDir& dir, const std::string& data, std::int64_t vocab,
                                 const std::string& name = "gpt.toml") {
  const std::string path = dir / name;
  std::ofstream(path) << "[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 16\n"
                      << "block_size = 16\nvocab_size = " << vocab << "\n"
                      << "[data]\n"
                      << data << "batch_size = 4\n"
                      << "[optimizer]\nkind = \"adamw\"\nlr = 0.01\n"
                      << "[train]\nmax_steps = 20\neval_every = 10\neval_iters = 3\n"
                      << "checkpoint_dir = \"" << dir / "ckpt"
                      << "\"\n";
  return path;
}

void expect_in(const std::string& output, const std::string& part) {
  EXPECT_NE(output.find(part), std::string::npos) << output;
}

TEST(HpmTokenizer, TrainsEncodesAndDecodesLosslessly) {
  SKIP_WITHOUT_FORTUNES();
  TempDir dir;
  const std::string corpus = fortunes_subset(dir);
  const std::string model = train_tokenizer(dir, corpus);
  EXPECT_TRUE(std::filesystem::exists(dir / "m.vocab"));
  // Printed ids, back to the text through standard input.
  const std::string text = "Linux: the choice of a GNU generation.\n\tcaf\xc3\xa9  \xe2\x98\x83\n";
  std::ofstream(dir / "text.txt", std::ios::binary) << text;
  const CommandResult ids =
      run_hpm("data tokenizer encode --model " + model + " \"$(cat " + dir / "text.txt" + ")\"");
  ASSERT_EQ(ids.code, 0) << ids.output;
  const CommandResult round = run_shell(hpm_binary() + " data tokenizer encode --model " + model +
                                        " \"$(printf 'a b\\nc')\" | " + hpm_binary() +
                                        " data tokenizer decode --model " + model);
  ASSERT_EQ(round.code, 0) << round.output;
  EXPECT_EQ(round.output, "a b\nc");
  const auto tok = data::load_sentencepiece(model);
  const std::string trimmed = text.substr(0, text.size() - 1);  // $(...) drops the last newline
  std::string expected;
  for (const auto id : tok->encode(trimmed)) expected += std::to_string(id) + " ";
  expected.back() = '\n';
  EXPECT_EQ(ids.output, expected);
  const CommandResult decoded = run_hpm("data tokenizer decode --model " + model + " " +
                                        ids.output.substr(0, ids.output.size() - 1));
  EXPECT_EQ(decoded.output, trimmed);
  CommandResult bad = run_shell("echo '5 x' | " + hpm_binary() + " data tokenizer decode --model " +
                                model + " 2>&1");
  EXPECT_EQ(bad.code, 1);
  expect_in(bad.output, "standard input: \"x\" (id 1) is not an integer");
  bad = run_hpm("data tokenizer decode --model " + model + " 5 800");
  EXPECT_EQ(bad.code, 1);
  expect_in(bad.output,
            "token 800 (position 1) is outside the vocabulary of 800 tokens of " + model);

  // Shards of the corpus: the byte corpus' split, encoded.
  const CommandResult enc = run_hpm("data tokenizer encode --model " + model + " --files '" +
                                    corpus + "' -o " + dir / "shards" + " --shard-tokens 10000");
  ASSERT_EQ(enc.code, 0) << enc.output;
  expect_in(enc.output, "3 files, 73112 bytes -> ");
  expect_in(enc.output, "/train-*.tokens (4)");
  const data::TokenCorpus shards =
      data::load_token_shards(dir / "shards/train-*.tokens", dir / "shards/val-*.tokens");
  EXPECT_EQ(shards.vocab_size, 800);
  EXPECT_EQ(shards.tokenizer, tok->fingerprint());
  const data::TextCorpus bytes = data::load_text_corpus(corpus);
  const auto text_of = [](const Tensor& t) {
    std::string s;
    for (auto v : t.to_vector_i64()) s.push_back(static_cast<char>(v));
    return s;
  };
  EXPECT_EQ(tok->decode(shards.train.to_tensor().to_vector_i64()), text_of(bytes.train));
  EXPECT_EQ(tok->decode(shards.val.to_tensor().to_vector_i64()), text_of(bytes.val));
  // Shards without --model hold bytes; a directory that holds shards already is not mixed into.
  ASSERT_EQ(run_hpm("data tokenizer encode --files '" + corpus + "' -o " + dir / "bytes").code, 0);
  EXPECT_EQ(data::load_token_shards(dir / "bytes/train-*.tokens", dir / "bytes/val-*.tokens")
                .train.to_tensor()
                .to_vector_i64(),
            bytes.train.to_vector_i64());
  const CommandResult again =
      run_hpm("data tokenizer encode --files '" + corpus + "' -o " + dir / "bytes");
  EXPECT_EQ(again.code, 1);
  expect_in(again.output, "already holds token shards (train-00000.tokens)");
  EXPECT_EQ(run_hpm("data tokenizer encode --model " + model).code, 2) << "TEXT or --files";
}

TEST(HpmTokenizer, GptTrainsFromATokenizerAndFromShardsAndSamples) {
  SKIP_WITHOUT_FORTUNES();
  TempDir dir;
  const std::string corpus = fortunes_subset(dir);
  const std::string model = train_tokenizer(dir, corpus);
  const std::string text_cfg = tokenizer_gpt_config(
      dir, "source = \"text\"\nfiles = \"" + corpus + "\"\ntokenizer = \"" + model + "\"\n", 800);
  const CommandResult r = run_hpm("train " + text_cfg + " --report " + dir / "text.json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(read_text(dir / "text.json"));
  EXPECT_EQ(j["steps"], 20);
  EXPECT_LT(j["val_loss"].get<double>(), std::log(800.0)) << "better than uniform";
  EXPECT_LT(j["history"][1]["train_metrics"]["loss"].get<double>(),
            j["history"][0]["train_metrics"]["loss"].get<double>());

  // The same tokens from shards: the same run, bit for bit.
  ASSERT_EQ(run_hpm("data tokenizer encode --model " + model + " --files '" + corpus + "' -o " +
                    dir / "shards")
                .code,
            0);
  const std::string shard_cfg = tokenizer_gpt_config(
      dir,
      "source = \"tokens\"\nfiles = \"" + dir / "shards/train-*.tokens" + "\"\ntest_files = \"" +
          dir / "shards/val-*.tokens" + "\"\ntokenizer = \"" + model + "\"\n",
      800, "shards.toml");
  const CommandResult s = run_hpm("train " + shard_cfg + " --set train.checkpoint_dir='\"" +
                                  dir / "ckpt2" + "\"' --report " + dir / "shards.json");
  ASSERT_EQ(s.code, 0) << s.output;
  EXPECT_EQ(report_number(dir / "shards.json", "val_loss"), j["val_loss"].get<double>());

  // Sampling: the prompt through the tokenizer, the drawn ids back to text.
  const CommandResult sample =
      run_hpm("sample " + text_cfg + " --checkpoint " + dir / "ckpt" +
              " --prompt 'Linux is' --tokens 12 --top-k 1 --report " + dir / "sample.json");
  ASSERT_EQ(sample.code, 0) << sample.output;
  const std::string drawn =
      nlohmann::json::parse(read_text(dir / "sample.json"))["text"].get<std::string>();
  EXPECT_FALSE(drawn.empty());
  expect_in(sample.output, drawn);
  const auto tok = data::load_sentencepiece(model);
  EXPECT_EQ(tok->decode(tok->encode(drawn)), drawn);
  EXPECT_LE(tok->encode(drawn).size(), 12u) << "12 tokens, re-encoded no longer";

  // Another tokenizer of the same size (trained on other text): its ids stand for other pieces.
  // The checkpoint records the tokenizer it was trained with, so sampling or evaluating it
  // through the other one is refused (it printed other text and exited 0), as is continuing it.
  std::filesystem::create_directories(dir / "other");
  for (const char* name : {"computers", "science", "people"})
    std::filesystem::copy_file(kFortunes + "/" + name, dir / ("other/" + std::string(name)));
  const std::string other = train_tokenizer(dir, dir / "other/*", "other");
  const std::string swapped = " --set data.tokenizer='\"" + other + "\"'";
  const std::string expect =
      "the checkpoint " + dir / "ckpt" + " was trained with tokenizer sentencepiece:";
  for (const std::string& command :
       {"sample " + text_cfg + " --checkpoint " + dir / "ckpt" + " --prompt 'Linux is'",
        "evaluate " + text_cfg + " --checkpoint " + dir / "ckpt"}) {
    const CommandResult refused = run_hpm(command + swapped);
    EXPECT_EQ(refused.code, 1) << command << refused.output;
    expect_in(refused.output, expect);
    expect_in(refused.output, "its ids would stand for other text");
  }
  const CommandResult resumed =
      run_hpm("train " + text_cfg + swapped + " --set train.max_steps=30 --resume " + dir / "ckpt");
  EXPECT_EQ(resumed.code, 1) << resumed.output;
  expect_in(resumed.output, "was trained with tokenizer sentencepiece:");
}

TEST(HpmTokenizer, MismatchesAndBadInputAreNamed) {
  SKIP_WITHOUT_FORTUNES();
  TempDir dir;
  const std::string corpus = fortunes_subset(dir);
  const std::string model = train_tokenizer(dir, corpus);
  const std::string text_cfg = tokenizer_gpt_config(
      dir, "source = \"text\"\nfiles = \"" + corpus + "\"\ntokenizer = \"" + model + "\"\n", 800);
  // A vocabulary that does not match the model: both numbers, and where.
  CommandResult r = run_hpm("train " + text_cfg + " --set model.vocab_size=256");
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, text_cfg + ":11:13: [data] tokenizer " + model +
                          " has 800 tokens, but [model] vocab_size is 256: the model's "
                          "vocabulary must be the tokenizer's");
  r = run_hpm("train " + text_cfg + " --set data.tokenizer=" + dir / "none.model");
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, "--set data.tokenizer=" + dir / "none.model" +
                          ": [data] tokenizer: " + dir / "none.model: cannot open");
  r = run_hpm("train " + text_cfg + " --set data.source=tokens");
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, "[data] source = \"tokens\" needs files and test_files");

  ASSERT_EQ(run_hpm("data tokenizer encode --model " + model + " --files '" + corpus + "' -o " +
                    dir / "shards")
                .code,
            0);
  const std::string shards = "source = \"tokens\"\nfiles = \"" + dir / "shards/train-*.tokens" +
                             "\"\ntest_files = \"" + dir / "shards/val-*.tokens" + "\"\n";
  const std::string train_shard = dir / "shards/train-00000.tokens";
  r = run_hpm("train " + tokenizer_gpt_config(dir, shards, 256, "bytes.toml"));
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, train_shard +
                          ": byte 16: the shard's vocabulary is 800 tokens, but [model] "
                          "vocab_size is 256");
  r = run_hpm("train " + tokenizer_gpt_config(dir, shards, 800, "notok.toml"));
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, train_shard + ": byte 36: encoded by the tokenizer of fingerprint 0x");
  expect_in(r.output, "but [data] tokenizer (bytes) is 0x00000000");
  // A shard with a bad header, then one with a bad payload.
  const std::string shard_cfg =
      tokenizer_gpt_config(dir, shards + "tokenizer = \"" + model + "\"\n", 800, "shards.toml");
  std::string file = read_text(train_shard);
  const std::string good = file;
  file[0] = 'X';
  std::ofstream(train_shard, std::ios::binary | std::ios::trunc) << file;
  r = run_hpm("train " + shard_cfg);
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, train_shard + ": byte 0: not an hpm token shard: magic \"XPMTOKEN\"");
  file = good;
  file[100] ^= 1;
  std::ofstream(train_shard, std::ios::binary | std::ios::trunc) << file;
  r = run_hpm("train " + shard_cfg);
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, train_shard + ": byte 64: payload checksum mismatch");
  file = good;
  file[20] ^= 1;  // the vocabulary size, under the header's checksum
  std::ofstream(train_shard, std::ios::binary | std::ios::trunc) << file;
  r = run_hpm("train " + shard_cfg);
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, train_shard + ": byte 60: header checksum mismatch");

  // A tokenizer where no config expects one.
  const std::string idx_cfg = dir / "idx.toml";
  std::ofstream(idx_cfg) << "[model]\nlayers = [{ type = \"flatten\" }]\n[data]\ntokenizer = \""
                         << model << "\"\n";
  r = run_hpm("train " + idx_cfg);
  EXPECT_EQ(r.code, 1);
  expect_in(r.output,
            "[data] tokenizer is for [data] source = \"text\" or \"tokens\", got "
            "source \"idx\"");
}

// Exported weights carry the tokenizer their ids mean, and evaluate (like init_from) checks it as
// it checks a checkpoint's: the export dropped it, and weights read with another tokenizer gave a
// loss of ids that stood for other text, without a word.
TEST(HpmTokenizer, ExportedWeightsRefuseAnotherTokenizer) {
  SKIP_WITHOUT_FORTUNES();
  TempDir dir;
  const std::string corpus = fortunes_subset(dir);
  const std::string model = train_tokenizer(dir, corpus);
  std::filesystem::create_directories(dir / "corpus2");  // another text: another tokenizer
  for (const char* name : {"art", "computers", "food"})
    std::filesystem::copy_file(kFortunes + "/" + name, dir / ("corpus2/" + std::string(name)));
  const std::string other = train_tokenizer(dir, dir / "corpus2/*", "other");
  const std::string cfg = tokenizer_gpt_config(
      dir, "source = \"text\"\nfiles = \"" + corpus + "\"\ntokenizer = \"" + model + "\"\n", 800);
  ASSERT_EQ(run_hpm("train " + cfg).code, 0);
  const std::string weights = dir / "w.safetensors";
  ASSERT_EQ(run_hpm("export " + dir / "ckpt" + " -o " + weights).code, 0);
  EXPECT_EQ(run_hpm("evaluate --weights " + weights).code, 0);
  const CommandResult r =
      run_hpm("evaluate --weights " + weights + " --set data.tokenizer=" + other);
  EXPECT_EQ(r.code, 1) << r.output;
  expect_in(r.output, "the weights " + weights + " was trained with tokenizer sentencepiece:");
}

TEST(HpmTokenizer, PromptOutsideTheVocabularyIsRefused) {
  SKIP_WITHOUT_FORTUNES();
  TempDir dir;
  const std::string corpus = fortunes_subset(dir);
  // Without byte fallback, characters the fortunes never use have no id.
  const std::string strict = train_tokenizer(dir, corpus, "strict", "--no-byte-fallback");
  const std::string cfg = tokenizer_gpt_config(
      dir, "source = \"text\"\nfiles = \"" + corpus + "\"\ntokenizer = \"" + strict + "\"\n", 800);
  ASSERT_EQ(run_hpm("train " + cfg).code, 0);
  CommandResult r = run_hpm("sample " + cfg + " --checkpoint " + dir / "ckpt" +
                            " --tokens 5 --prompt 'snow \xe2\x98\x83 man'");
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, "hpm: error: --prompt: characters outside the vocabulary of " + strict +
                          ": '\xe2\x98\x83' (U+2603) at byte 5 (the model has no byte fallback, "
                          "so they would be <unk>)");
  r = run_hpm("sample " + cfg + " --checkpoint " + dir / "ckpt" + " --tokens 5 --prompt 'snow'");
  EXPECT_EQ(r.code, 0) << r.output;
  r = run_hpm("data tokenizer encode --model " + strict + " 'caf\xc3\xa9 \xe4\xb8\xad'");
  EXPECT_EQ(r.code, 1);
  expect_in(r.output, "TEXT: characters outside the vocabulary of " + strict);
  expect_in(r.output, "'\xe4\xb8\xad' (U+4E2D) at byte 6");
}

}  // namespace
}  // namespace hpm
