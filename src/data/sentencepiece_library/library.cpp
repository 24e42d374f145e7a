// libhpm_sentencepiece.so: SentencePiece behind the C interface of library.h. Built as a shared
// library of its own (not part of hpm_data) and without sanitizers: it runs in a separate link
// namespace with its own C and C++ runtimes, where a sanitizer's runtime could not follow.
#include "library.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using sentencepiece::SentencePieceProcessor;

const SentencePieceProcessor& sp(const void* model) {
  return *static_cast<const SentencePieceProcessor*>(model);
}

int fail(hpm_spm_bytes_fn error, void* ctx, const std::string& message) {
  error(ctx, message.data(), message.size());
  return -1;
}

// Runs `body`, turning a bad status or an exception into an error message.
template <typename F>
int guarded(hpm_spm_bytes_fn error, void* ctx, F body) {
  try {
    const sentencepiece::util::Status st = body();
    return st.ok() ? 0 : fail(error, ctx, st.error_message());
  } catch (const std::exception& e) {
    return fail(error, ctx, e.what());
  } catch (...) {
    return fail(error, ctx, "unknown exception in SentencePiece");
  }
}

// The training lines, handed to the trainer in order.
class Lines final : public sentencepiece::SentenceIterator {
 public:
  Lines(const char* const* lines, const size_t* lengths, size_t count)
      : lines_(lines), lengths_(lengths), count_(count) {
    load();
  }
  bool done() const override { return i_ >= count_; }
  void Next() override {
    ++i_;
    load();
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    if (i_ < count_) value_.assign(lines_[i_], lengths_[i_]);
  }
  const char* const* lines_;
  const size_t* lengths_;
  size_t count_, i_ = 0;
  std::string value_;
};

}  // namespace

extern "C" {

int hpm_spm_load(const char* model, size_t n, void** out, hpm_spm_bytes_fn error, void* ctx) {
  auto* p = new SentencePieceProcessor();
  const int rc = guarded(error, ctx, [&] { return p->LoadFromSerializedProto({model, n}); });
  if (rc != 0) {
    delete p;
    return rc;
  }
  *out = p;
  return 0;
}

void hpm_spm_free(void* model) { delete static_cast<SentencePieceProcessor*>(model); }

int hpm_spm_piece_size(const void* model) { return sp(model).GetPieceSize(); }

int hpm_spm_unk_id(const void* model) { return sp(model).unk_id(); }

const char* hpm_spm_id_to_piece(const void* model, int id) {
  return sp(model).IdToPiece(id).c_str();
}

float hpm_spm_score(const void* model, int id) { return sp(model).GetScore(id); }

int hpm_spm_encode(const void* model, const char* text, size_t n, hpm_spm_ids_fn ids,
                   hpm_spm_bytes_fn error, void* ctx) {
  return guarded(error, ctx, [&] {
    std::vector<int> out;
    auto st = sp(model).Encode({text, n}, &out);
    if (st.ok()) ids(ctx, out.data(), out.size());
    return st;
  });
}

int hpm_spm_unknown_spans(const void* model, const char* text, size_t n, hpm_spm_span_fn span,
                          hpm_spm_bytes_fn error, void* ctx) {
  return guarded(error, ctx, [&] {
    const auto spt = sp(model).EncodeAsImmutableProto({text, n});
    const int unk = sp(model).unk_id();
    for (const auto& p : spt.pieces()) {
      if (static_cast<int>(p.id()) == unk) span(ctx, p.begin(), p.end());
    }
    return sentencepiece::util::Status();
  });
}

int hpm_spm_decode(const void* model, const int* ids, size_t n, hpm_spm_bytes_fn text,
                   hpm_spm_bytes_fn error, void* ctx) {
  return guarded(error, ctx, [&] {
    std::string out;
    auto st = sp(model).Decode(std::vector<int>(ids, ids + n), &out);
    if (st.ok()) text(ctx, out.data(), out.size());
    return st;
  });
}

int hpm_spm_train(const char* const* keys, const char* const* values, size_t options,
                  const char* const* lines, const size_t* lengths, size_t count,
                  hpm_spm_bytes_fn model, hpm_spm_bytes_fn error, void* ctx) {
  return guarded(error, ctx, [&] {
    std::unordered_map<std::string, std::string> args;
    for (size_t i = 0; i < options; ++i) args[keys[i]] = values[i];
    Lines it(lines, lengths, count);
    std::string out;
    auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &out);
    if (st.ok()) model(ctx, out.data(), out.size());
    return st;
  });
}
}
