// The C interface of libhpm_sentencepiece.so, a small shared library around Debian's
// libsentencepiece that hpm loads into a link namespace of its own (dlmopen; see
// sentencepiece_loader.h for why). Only C types cross: results come back through callbacks into
// the caller's namespace, and no exception, C++ object or allocation passes between the two.
#pragma once
#include <stddef.h>

extern "C" {

// Receives bytes (text, a serialized model, an error message) or ids; `ctx` is the caller's.
typedef void (*hpm_spm_bytes_fn)(void* ctx, const char* data, size_t n);
typedef void (*hpm_spm_ids_fn)(void* ctx, const int* ids, size_t n);
typedef void (*hpm_spm_span_fn)(void* ctx, size_t begin, size_t end);

// Every function that can fail returns 0 on success, else calls `error` with SentencePiece's
// message and returns -1.

// A model from its serialized bytes (a .model file's contents); *out is the handle.
int hpm_spm_load(const char* model, size_t n, void** out, hpm_spm_bytes_fn error, void* ctx);
void hpm_spm_free(void* model);
int hpm_spm_piece_size(const void* model);
int hpm_spm_unk_id(const void* model);
// The piece of an id (valid while the model lives), and its score.
const char* hpm_spm_id_to_piece(const void* model, int id);
float hpm_spm_score(const void* model, int id);
int hpm_spm_encode(const void* model, const char* text, size_t n, hpm_spm_ids_fn ids,
                   hpm_spm_bytes_fn error, void* ctx);
// The byte spans of `text` that encode to <unk>.
int hpm_spm_unknown_spans(const void* model, const char* text, size_t n, hpm_spm_span_fn span,
                          hpm_spm_bytes_fn error, void* ctx);
int hpm_spm_decode(const void* model, const int* ids, size_t n, hpm_spm_bytes_fn text,
                   hpm_spm_bytes_fn error, void* ctx);
// Trains on `lines` with SentencePieceTrainer's options (`keys[i]` = `values[i]`); the serialized
// model comes back through `model`.
int hpm_spm_train(const char* const* keys, const char* const* values, size_t options,
                  const char* const* lines, const size_t* lengths, size_t count,
                  hpm_spm_bytes_fn model, hpm_spm_bytes_fn error, void* ctx);
}
