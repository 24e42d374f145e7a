// Training a SentencePiece model on a text corpus, with the options that make it lossless and
// reproducible (see train_sentencepiece in tokenizer.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

#include "data/sentencepiece_loader.h"
#include "hpm/data/dataset.h"
#include "hpm/data/text_corpus.h"
#include "hpm/data/tokenizer.h"
#include "hpm/io/atomic_file.h"

namespace hpm::data {

namespace {

// SentencePiece's default longest sentence; longer lines raise the limit rather than be dropped.
constexpr std::size_t kDefaultMaxSentence = 4192;

// A piece as one line of the .vocab file: the characters that would break the line escaped.
std::string escaped(const std::string& piece) {
  std::string s;
  for (const char ch : piece) {
    switch (ch) {
      case '\n':
        s += "\\n";
        break;
      case '\t':
        s += "\\t";
        break;
      case '\r':
        s += "\\r";
        break;
      case '\\':
        s += "\\\\";
        break;
      default:
        s.push_back(ch);
    }
  }
  return s;
}

}  // namespace

TrainedTokenizer train_sentencepiece(const std::string& pattern, const std::string& prefix,
                                     const SentencePieceOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.model_type != "unigram" && o.model_type != "bpe") {
    throw std::invalid_argument("train_sentencepiece: model type must be unigram or bpe, got " +
                                o.model_type);
  }
  TrainedTokenizer out;
  std::vector<std::string> lines;
  std::size_t longest = 0;
  for (const std::string& path : text_corpus_files(pattern)) {
    const std::string text = split_text_file(path, o.train_fraction, true).first;
    if (const std::size_t bad = first_invalid_utf8(text); bad != std::string::npos) {
      throw DataError(path, "byte " + std::to_string(bad) +
                                ": not UTF-8; a SentencePiece tokenizer learns from Unicode text");
    }
    ++out.files;
    out.bytes += static_cast<std::int64_t>(text.size());
    std::size_t begin = 0;
    while (begin < text.size()) {
      std::size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      if (end > begin) {
        lines.emplace_back(text, begin, end - begin);
        longest = std::max(longest, end - begin);
      }
      begin = end + 1;
    }
  }
  out.lines = static_cast<std::int64_t>(lines.size());
  // Lossless: no normalization, whitespace kept as it is (no dummy space at the start, runs of
  // spaces kept), characters outside the vocabulary as bytes, the newline a piece of its own (the
  // trainer sees lines) and the tab too (SentencePiece never learns a control character as a
  // piece: without byte fallback, every tab would be <unk>).
  // Reproducible: every line, in order, no sampling; the model comes back in memory (no
  // model_prefix recorded in it), so the same inputs give the same bytes wherever it is written.
  const std::vector<std::pair<std::string, std::string>> args = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"byte_fallback", o.byte_fallback ? "true" : "false"},
      {"character_coverage", o.byte_fallback ? "0.9995" : "1.0"},
      {"user_defined_symbols", "\n,\t"},
      {"max_sentence_length", std::to_string(std::max(kDefaultMaxSentence, longest + 1))},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", std::to_string(o.threads)},
      {"minloglevel", "2"},  // SentencePiece's progress lines: errors come back as a status
  };
  std::string model;
  try {
    model = spm::train(args, lines);
  } catch (const std::runtime_error& e) {
    throw DataError(pattern, "SentencePiece cannot train a " + o.model_type + " model of " +
                                 std::to_string(o.vocab_size) + " pieces: " + e.what());
  }
  const spm::Model sp(model);
  if (const auto dir = std::filesystem::path(prefix).parent_path(); !dir.empty()) {
    io::ensure_directory(dir.string());
  }
  out.model_path = prefix + ".model";
  out.vocab_path = prefix + ".vocab";
  io::write_file_atomic(out.model_path, model);
  std::string vocab;
  for (int id = 0; id < sp.piece_size(); ++id) {
    char score[32];
    std::snprintf(score, sizeof score, "%g", static_cast<double>(sp.score(id)));
    vocab += escaped(sp.piece(id)) + "\t" + score + "\n";
  }
  io::write_file_atomic(out.vocab_path, vocab);
  out.vocab_size = sp.piece_size();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace hpm::data
