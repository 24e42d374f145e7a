// Tokenizers: text to token ids and back. Bytes (vocabulary 256, what the byte-level corpus has
// always used) or a SentencePiece model (BPE or unigram subwords, the tokenizer of T5 and LLaMA),
// loaded from its .model file or trained here from text files.
//
//   auto tok = load_sentencepiece("fortunes.model");
//   std::vector<std::int64_t> ids = tok->encode("Q: Why", "--prompt");
//   std::string text = tok->decode(ids);                       // "Q: Why"
//
// A model trained by train_sentencepiece is lossless: decode(encode(text)) == text byte for byte
// for any UTF-8 text (identity normalization, whitespace kept, byte fallback for characters the
// vocabulary lacks). SentencePiece learns from lines, so the newline is a piece of its own (a
// user-defined symbol, as is the tab, a control character it would not learn) and no other
// piece spans one; such a model encodes a text line by line, so
// hpm's ids for a text are exactly spm_encode's ids for each of its lines, joined by the
// newline's id. (A model without a newline piece, or one that adds a space at the start of a
// text, encodes the text whole.)
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hpm::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of `text`. Throws DataError naming `origin` (a file, "--prompt") and the byte offset
  // (`offset` + the offset in `text`: where the text starts in its file) when the text cannot be
  // encoded without loss: bytes that are not UTF-8 (SentencePiece reads Unicode), or characters
  // outside the vocabulary (which SentencePiece would turn into <unk>, possible only for a model
  // without byte fallback).
  virtual std::vector<std::int64_t> encode(std::string_view text,
                                           const std::string& origin = "text",
                                           std::size_t offset = 0) const = 0;
  // The text of `ids`. Throws std::out_of_range naming the first id outside [0, vocab_size()).
  virtual std::string decode(const std::vector<std::int64_t>& ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;
  // "bytes", or the model file it was loaded from.
  virtual const std::string& name() const = 0;
  // What token shards record to tell tokenizers apart: 0 for bytes, else the CRC32C of the model
  // file (two models with the same vocabulary size encode differently).
  virtual std::uint32_t fingerprint() const = 0;
};

// Text as its ids arrive one by one (a model's sampling): add() returns what is new since the last
// call. A character whose bytes are not all there yet decodes as U+FFFD; it is held back until it
// is whole, or until finish() (which returns the rest, replacement characters and all).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string add(std::int64_t id);
  std::string finish();
  const std::vector<std::int64_t>& ids() const { return ids_; }

 private:
  std::string advance(const std::string& text);
  const Tokenizer& tokenizer_;
  std::vector<std::int64_t> ids_;
  std::string shown_;
};

// Token ids are the bytes of the text (vocabulary 256).
std::shared_ptr<const Tokenizer> byte_tokenizer();

// A SentencePiece model file. Throws DataError naming the path if it cannot be read or parsed.
std::shared_ptr<const Tokenizer> load_sentencepiece(const std::string& model_path);

struct SentencePieceOptions {
  std::int64_t vocab_size = 4096;
  std::string model_type = "unigram";  // unigram | bpe
  // Characters the vocabulary lacks become their UTF-8 bytes (pieces <0x00>..<0xFF>), so nothing
  // is ever <unk>. Off: such characters are refused by encode.
  bool byte_fallback = true;
  // SentencePiece learns from the first train_fraction of each file, the part load_text_corpus
  // trains on, so the validation text stays unseen.
  double train_fraction = 0.9;
  int threads = 1;  // the trainer's threads; the model depends on them, not on the run
};

struct TrainedTokenizer {
  std::string model_path, vocab_path;  // PREFIX.model, PREFIX.vocab
  std::int64_t vocab_size = 0, files = 0, lines = 0, bytes = 0;
  double seconds = 0;
};

// Trains a SentencePiece model on the training part of every file `pattern` matches (the files
// load_text_corpus reads, split as it splits them), line by line, and writes PREFIX.model (the
// model, atomically) and PREFIX.vocab (piece TAB score per line; \n, \t, \r and \ escaped). The
// same files and options give the same model file. Throws DataError naming the file and byte
// offset for input that is not UTF-8 text, and SentencePiece's message for options it refuses
// (a vocabulary too small for the characters and bytes, or too large for the text).
TrainedTokenizer train_sentencepiece(const std::string& pattern, const std::string& prefix,
                                     const SentencePieceOptions& options = {});

// The offset of the first byte of `text` that does not start a valid UTF-8 sequence (overlong
// forms, surrogates and code points past U+10FFFF are invalid), or npos.
std::size_t first_invalid_utf8(std::string_view text);

}  // namespace hpm::data
