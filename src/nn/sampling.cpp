#include "hpm/nn/sampling.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "hpm/autograd/grad_mode.h"
#include "hpm/tensor/device.h"

namespace hpm::nn {

namespace {

Tensor row(const std::vector<std::int64_t>& tokens, Device& device) {
  return Tensor::from_i64(tokens, Shape{1, static_cast<std::int64_t>(tokens.size())}).to(device);
}

}  // namespace

std::int64_t draw_token(const Tensor& logits, float temperature, std::int64_t top_k,
                        Generator& gen) {
  std::vector<float> z = logits.to_vector();
  if (top_k > 0 && top_k < static_cast<std::int64_t>(z.size())) {
    std::vector<float> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
    const float kth = sorted[static_cast<std::size_t>(top_k - 1)];
    for (float& v : z)
      if (v < kth) v = -INFINITY;
  }
  const float mx = *std::max_element(z.begin(), z.end());
  double total = 0;
  for (float& v : z) total += v = std::exp((v - mx) / temperature);
  double u = static_cast<double>(gen.uniform()) * total;
  for (std::size_t i = 0; i < z.size(); ++i) {
    u -= z[i];
    if (u <= 0) return static_cast<std::int64_t>(i);
  }
  return static_cast<std::int64_t>(z.size() - 1);
}

std::vector<std::int64_t> sample(GPT& model, std::vector<std::int64_t> tokens,
                                 const SampleOptions& o,
                                 const std::function<void(std::int64_t)>& on_token) {
  const std::int64_t vocab = model.config().vocab_size, block = model.config().block_size;
  if (!(o.temperature > 0.0f) || !std::isfinite(o.temperature))
    throw std::invalid_argument("sample: the temperature must be finite and positive");
  if (tokens.empty()) throw std::invalid_argument("sample: the prompt holds no token");
  for (std::int64_t id : tokens) {
    if (id < 0 || id >= vocab) {
      throw std::invalid_argument("sample: prompt token " + std::to_string(id) +
                                  " is outside the model's vocabulary of " + std::to_string(vocab));
    }
  }
  if (static_cast<std::int64_t>(tokens.size()) > block)
    tokens.erase(tokens.begin(), tokens.end() - block);  // the model sees block_size tokens
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  // Every tensor of the drawing (the key/value cache, the logits) is made where the weights are;
  // only each token's logits come back to the host to be drawn from.
  Device& device = model.tok->weight.device();
  DeviceGuard on(device);
  const std::int64_t usable = o.usable_vocab > 0 ? std::min(vocab, o.usable_vocab) : vocab;
  Generator gen(o.seed);
  std::vector<std::int64_t> drawn;
  KVCache cache;
  Tensor logits = o.no_cache ? Tensor() : model.decode(row(tokens, device), cache).reshape({vocab});
  for (std::int64_t n = 0; n < o.tokens; ++n) {
    if (o.no_cache) {
      const auto t = static_cast<std::int64_t>(tokens.size());
      logits =
          model.forward(row(tokens, device)).reshape({t, vocab}).narrow(t - 1, 1).reshape({vocab});
    }
    const std::int64_t next =
        draw_token(usable < vocab ? logits.narrow(0, usable) : logits, o.temperature, o.top_k, gen);
    drawn.push_back(next);
    if (on_token) on_token(next);
    tokens.push_back(next);
    if (static_cast<std::int64_t>(tokens.size()) > block) tokens.erase(tokens.begin());
    if (n + 1 == o.tokens || o.no_cache) continue;
    if (cache.length >= block) {
      // Positions are absolute (learned embeddings): once the window is full, a token's keys and
      // values depend on where the window starts, so the cache cannot slide. The window is run
      // again (as no_cache does; the same block_size tokens, the same text), and the cache saves
      // work only while the window fills.
      cache = KVCache{};
      const std::vector<std::int64_t> keep(tokens.end() - block, tokens.end() - 1);
      if (!keep.empty()) model.decode(row(keep, device), cache);
      logits = model.decode(row({tokens.back()}, device), cache).reshape({vocab});
    } else {
      logits = model.decode(row({next}, device), cache).reshape({vocab});
    }
  }
  model.train(was_training);
  return drawn;
}

}  // namespace hpm::nn
