// GPT: the decoder-only transformer language model of nanoGPT, exactly as
// ../shared/peers/torch_gpt.py defines it, with its parameter names, so that a PyTorch state dict
// of that model loads here by name and one saved here loads there.
//
// Legend: B = batch, T = positions (<= block_size), E = n_embd, H = n_head, D = E / H, V = vocab.
//
//   tok (V, E), pos (block_size, E)    x = tok[idx] + pos[0..T)                       (B, T, E)
//   blocks.i: ln1, qkv (3E, E), proj   x = x + proj(attention(qkv(ln1(x))))           (B, T, E)
//             ln2, fc (4E, E), out     x = x + out(gelu(fc(ln2(x))))                  (B, T, E)
//   ln, head (V, E) = tok (tied)       logits = head(ln(x))                           (B, T, V)
#pragma once
#include <cstdint>
#include <memory>

#include "hpm/nn/containers.h"
#include "hpm/nn/layers.h"

namespace hpm::nn {

struct GPTConfig {
  std::int64_t n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, vocab_size = 256;
  float dropout = 0.0f;
  bool bias = true;         // biases in the Linears and LayerNorms
  bool tie_weights = true;  // the head shares the token embedding's weight
};

// The keys and values every block computed for the positions decoded so far, (B, H, t, D) each:
// what incremental decoding keeps so that a new token costs one position, not the whole window.
struct KVCache {
  std::vector<Tensor> k, v;  // per block
  std::int64_t length = 0;   // t, positions cached
};

// One pre-LayerNorm transformer block: causal multi-head self-attention (one fused qkv Linear,
// the fused attention op, an output Linear) and a 4x GELU MLP, each around a residual.
class TransformerBlock : public Module {
 public:
  TransformerBlock(const GPTConfig& c, Generator& gen);
  Tensor forward(const Tensor& x) override;  // (B, T, E) -> (B, T, E)
  // The same for new positions after those in k and v (appended to them): a prompt into an empty
  // cache (causal among its tokens), then one token at a time (attending to every cached key).
  Tensor forward_cached(const Tensor& x, Tensor& k, Tensor& v);
  std::string type_name() const override { return "TransformerBlock"; }
  std::shared_ptr<LayerNorm> ln1, ln2;
  std::shared_ptr<Linear> qkv, proj, fc, out;

 private:
  // x is (B, T, E), else std::invalid_argument naming the shapes.
  void check_input(const Tensor& x) const;
  // (B, T, E) -> q, k, v as (B, H, T, D) each (the cached path; training packs them).
  std::vector<Tensor> heads(const Tensor& x);
  // Attention's heads merged (B, T, E) through the projection and the MLP.
  Tensor finish(const Tensor& x, const Tensor& merged);
  // The attention's projected output (B, T, E) through the residual and the MLP.
  Tensor mlp(const Tensor& x, Tensor attended);
  std::int64_t n_head_;
  std::shared_ptr<Dropout> drop_;
};

// Token and position embeddings: the first block. idx (B, T) I64 -> (B, T, E).
class GPTEmbedding : public Module {
 public:
  GPTEmbedding(std::shared_ptr<Embedding> tok, std::shared_ptr<Embedding> pos, float dropout);
  Tensor forward(const Tensor& idx) override { return embed(idx, 0); }
  // Positions offset, offset + 1, ... for idx's tokens.
  Tensor embed(const Tensor& idx, std::int64_t offset);
  std::string type_name() const override { return "GPTEmbedding"; }

 private:
  std::shared_ptr<Embedding> tok_, pos_;
  std::shared_ptr<Dropout> drop_;
};

// The final LayerNorm and the vocabulary projection: the last block. (B, T, E) -> (B, T, V).
class GPTHead : public Module {
 public:
  GPTHead(std::shared_ptr<LayerNorm> ln, std::shared_ptr<Linear> head);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "GPTHead"; }

 private:
  std::shared_ptr<LayerNorm> ln_;
  std::shared_ptr<Linear> head_;
};

class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& c, Generator& gen = default_generator());
  // idx (B, T) I64 token ids, T <= block_size -> logits (B, T, V).
  Tensor forward(const Tensor& idx) override;
  // The embeddings, each transformer block, the head: n_layer + 2 blocks. Blocks share modules
  // with the model (same parameters, the model's names).
  std::vector<std::shared_ptr<Module>> blocks() const override { return blocks_; }
  // Incremental decoding without gradients: the logits (B, V) of the token after `tokens`
  // (B, n), which take positions cache.length, ...; their keys and values join the cache. A
  // prompt goes in whole into an empty cache, then one token per call. Throws
  // std::invalid_argument past block_size, or for several tokens into a non-empty cache.
  Tensor decode(const Tensor& tokens, KVCache& cache);
  std::string type_name() const override { return "GPT"; }
  std::string extra_repr() const override;
  const GPTConfig& config() const { return c_; }

  std::shared_ptr<Embedding> tok, pos;
  std::shared_ptr<ModuleList> layers;  // registered as "blocks", as in torch_gpt.py
  std::shared_ptr<LayerNorm> ln;
  std::shared_ptr<Linear> head;

 private:
  GPTConfig c_;
  std::vector<std::shared_ptr<Module>> blocks_;
};

}  // namespace hpm::nn
