#include "hpm/nn/gpt.h"

#include <cmath>
#include <stdexcept>
#include <utility>

#include "hpm/autograd/autocast.h"
#include "hpm/autograd/grad_mode.h"

namespace hpm::nn {

namespace {

// normal(0, std) for a weight, zeros for a bias: torch_gpt.py's initialization.
void init_normal(Tensor& t, float stddev, Generator& gen) {
  t.copy_(Tensor::randn(t.shape(), gen, 0.0f, stddev));
}

void init_linear(Linear& l, float stddev, Generator& gen) {
  init_normal(l.weight, stddev, gen);
  if (l.bias.defined()) l.bias.zero_();
}

void check_config(const GPTConfig& c) {
  const auto positive = [](std::int64_t v, const char* name) {
    if (v <= 0) {
      throw std::invalid_argument(std::string("GPT: ") + name + " must be positive, got " +
                                  std::to_string(v));
    }
  };
  positive(c.n_layer, "n_layer");
  positive(c.n_head, "n_head");
  positive(c.n_embd, "n_embd");
  positive(c.block_size, "block_size");
  positive(c.vocab_size, "vocab_size");
  if (c.n_embd % c.n_head != 0) {
    throw std::invalid_argument("GPT: n_embd " + std::to_string(c.n_embd) +
                                " is not a multiple of n_head " + std::to_string(c.n_head));
  }
}

}  // namespace

// ---- transformer block --------------------------------------------------------------------

TransformerBlock::TransformerBlock(const GPTConfig& c, Generator& gen) : n_head_(c.n_head) {
  const std::int64_t e = c.n_embd;
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(Shape{e}, 1e-5f, true));
  qkv = register_module("qkv", std::make_shared<Linear>(e, 3 * e, c.bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(e, e, c.bias, gen));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(Shape{e}, 1e-5f, true));
  fc = register_module("fc", std::make_shared<Linear>(e, 4 * e, c.bias, gen));
  out = register_module("out", std::make_shared<Linear>(4 * e, e, c.bias, gen));
  if (!c.bias) {
    // nanoGPT's bias = False drops the LayerNorms' biases too.
    ln1->replace_parameter("bias", Tensor());
    ln2->replace_parameter("bias", Tensor());
    ln1->bias = ln2->bias = Tensor();
  }
  drop_ = std::make_shared<Dropout>(c.dropout);
}

void TransformerBlock::check_input(const Tensor& x) const {
  if (x.dim() != 3 || x.size(2) != qkv->weight.size(1)) {
    throw std::invalid_argument("TransformerBlock: expected (B, T, " +
                                std::to_string(qkv->weight.size(1)) + "), got " + x.shape().str());
  }
}

std::vector<Tensor> TransformerBlock::heads(const Tensor& x) {
  check_input(x);
  const std::int64_t b = x.size(0), t = x.size(1), e = x.size(2), d = e / n_head_;
  // (B, T, 3E) -> (3, B, H, T, D): q, k and v with the heads split out.
  Tensor all =
      permute(reshape(qkv->forward_after(*ln1, x), {b, t, 3, n_head_, d}), {2, 0, 3, 1, 4});
  std::vector<Tensor> parts = split(all, 1, 0);
  for (Tensor& p : parts) p = reshape(p, {b, n_head_, t, d});
  return parts;
}

Tensor TransformerBlock::finish(const Tensor& x, const Tensor& merged) {
  return mlp(x, proj->forward(merged));
}

// An activation no rule keeps dies at its last use, not at the end of the statement that made it:
// the block's transients (the qkv product's f32 output, 3E wide; the fc product's, 4E) otherwise
// stay held through what follows and raise the step's peak memory by one of them.
Tensor TransformerBlock::mlp(const Tensor& x, Tensor attended) {
  // Written on a change of mode only: concurrent forwards of a shared model just read it.
  if (drop_->is_training() != is_training()) drop_->train(is_training());
  // h = x + attended, written by ln2's pass over it (one read of x and attended, no second of h);
  // under bf16 autocast the fc product's output is written in bf16 for the GELU (autocast's
  // rounding: half the bytes of the block's widest activation, written and read).
  Tensor h;
  Tensor f = fc->forward_after_sum(*ln2, x, drop_->forward(attended), h, DType::BF16);
  attended = Tensor();
  // Without dropout, the residual h added by the out product itself (no pass over h and m).
  if (!drop_->is_training() || drop_->p() == 0.0f) return out->forward_after_gelu(f, h);
  Tensor m = out->forward_after_gelu(f);
  f = Tensor();
  return add(h, drop_->forward(m));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  check_input(x);
  // Under bf16 autocast the qkv product writes bf16 (its heads would be rounded on the split).
  Tensor attended =
      proj->forward_after_attention(qkv->forward_after(*ln1, x, DType::BF16), n_head_);
  return mlp(x, std::move(attended));
}

Tensor TransformerBlock::forward_cached(const Tensor& x, Tensor& k, Tensor& v) {
  const std::vector<Tensor> qkv_heads = heads(x);
  const bool first = !k.defined();
  if (!first && x.size(1) != 1) {
    throw std::invalid_argument("TransformerBlock: after the prompt, one token at a time");
  }
  k = first ? qkv_heads[1] : concat({k, qkv_heads[1]}, 2);
  v = first ? qkv_heads[2] : concat({v, qkv_heads[2]}, 2);
  // The prompt attends causally among itself; a later token sees every cached key, its own last.
  const Tensor y = scaled_dot_product_attention(qkv_heads[0], k, v, /*causal=*/first);
  return finish(x, reshape(permute(y, {0, 2, 1, 3}), x.shape()));  // (B, H, T, D) -> (B, T, E)
}

// ---- embeddings and head ----------------------------------------------------------------------

GPTEmbedding::GPTEmbedding(std::shared_ptr<Embedding> tok, std::shared_ptr<Embedding> pos,
                           float dropout)
    : tok_(register_module("tok", std::move(tok))),
      pos_(register_module("pos", std::move(pos))),
      drop_(std::make_shared<Dropout>(dropout)) {}

Tensor GPTEmbedding::embed(const Tensor& idx, std::int64_t offset) {
  if (idx.dim() != 2 || idx.dtype() != DType::I64) {
    throw std::invalid_argument("GPT: expected token ids (B, T) of type I64, got " +
                                idx.shape().str() + " " + dtype_name(idx.dtype()));
  }
  const std::int64_t t = idx.size(1), block = pos_->weight.size(0);
  if (offset + t > block) {
    throw std::invalid_argument("GPT: a sequence of " + std::to_string(offset + t) +
                                " tokens is longer than block_size " + std::to_string(block));
  }
  std::vector<std::int64_t> positions(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i) positions[static_cast<std::size_t>(i)] = offset + i;
  const Tensor where = Tensor::from_i64(positions, Shape{t}, idx.device());
  // Written on a change of mode only: concurrent forwards of a shared model just read it.
  if (drop_->is_training() != is_training()) drop_->train(is_training());
  return drop_->forward(add(tok_->forward(idx), pos_->forward(where)));
}

GPTHead::GPTHead(std::shared_ptr<LayerNorm> ln, std::shared_ptr<Linear> head)
    : ln_(register_module("ln", std::move(ln))), head_(register_module("head", std::move(head))) {}

// The logits in bf16 where the objective takes them so (autocast.h): PyTorch's autocast rounds
// its classifier's output too.
Tensor GPTHead::forward(const Tensor& x) {
  return head_->forward_after(*ln_, x, autograd::bf16_outputs() ? DType::BF16 : DType::F32);
}

// ---- the model --------------------------------------------------------------------------------

GPT::GPT(const GPTConfig& c, Generator& gen) : c_(c) {
  check_config(c);
  tok = register_module("tok", std::make_shared<Embedding>(c.vocab_size, c.n_embd, gen));
  pos = register_module("pos", std::make_shared<Embedding>(c.block_size, c.n_embd, gen));
  layers = register_module("blocks", std::make_shared<ModuleList>());
  for (std::int64_t i = 0; i < c.n_layer; ++i)
    layers->push_back(std::make_shared<TransformerBlock>(c, gen));
  ln = register_module("ln", std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5f, true));
  if (!c.bias) {
    ln->replace_parameter("bias", Tensor());
    ln->bias = Tensor();
  }
  head = register_module("head", std::make_shared<Linear>(c.n_embd, c.vocab_size, false, gen));

  // torch_gpt.py's init: N(0, 0.02) for every Linear and Embedding weight, zero biases, and
  // N(0, 0.02 / sqrt(2 n_layer)) for the projections that feed each residual.
  init_normal(tok->weight, 0.02f, gen);
  init_normal(pos->weight, 0.02f, gen);
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(c.n_layer));
  for (std::size_t i = 0; i < layers->size(); ++i) {
    auto& b = static_cast<TransformerBlock&>(*(*layers)[i]);
    init_linear(*b.qkv, 0.02f, gen);
    init_linear(*b.fc, 0.02f, gen);
    init_linear(*b.proj, residual_std, gen);
    init_linear(*b.out, residual_std, gen);
  }
  if (c.tie_weights) {
    head->weight = tok->weight;
    head->replace_parameter("weight", tok->weight);
  } else {
    init_normal(head->weight, 0.02f, gen);
  }

  blocks_.push_back(std::make_shared<GPTEmbedding>(tok, pos, c.dropout));
  for (std::size_t i = 0; i < layers->size(); ++i) blocks_.push_back((*layers)[i]);
  blocks_.push_back(std::make_shared<GPTHead>(ln, head));
}

Tensor GPT::forward(const Tensor& idx) { return forward_blocks(idx); }

Tensor GPT::decode(const Tensor& tokens, KVCache& cache) {
  NoGradGuard no_grad;
  const auto n_blocks = static_cast<std::size_t>(c_.n_layer);
  if (cache.k.empty()) {
    cache.k.resize(n_blocks);
    cache.v.resize(n_blocks);
  }
  Tensor h = static_cast<GPTEmbedding&>(*blocks_.front()).embed(tokens, cache.length);
  for (std::size_t i = 0; i < n_blocks; ++i) {
    h = static_cast<TransformerBlock&>(*(*layers)[i]).forward_cached(h, cache.k[i], cache.v[i]);
  }
  cache.length += tokens.size(1);
  // Only the last position's logits: (B, 1, E) -> (B, V).
  const Tensor last = narrow(h, 1, h.size(1) - 1, 1);
  return reshape(head->forward(ln->forward(last)), {h.size(0), c_.vocab_size});
}

std::string GPT::extra_repr() const {
  return "n_layer=" + std::to_string(c_.n_layer) + ", n_head=" + std::to_string(c_.n_head) +
         ", n_embd=" + std::to_string(c_.n_embd) + ", block_size=" + std::to_string(c_.block_size) +
         ", vocab_size=" + std::to_string(c_.vocab_size) +
         ", tie_weights=" + (c_.tie_weights ? "true" : "false");
}

}  // namespace hpm::nn
