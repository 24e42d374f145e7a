// Text from a trained GPT, token by token (nanoGPT's sample.py, in C++): the prompt goes through
// the model once, then each new token costs one position, its keys and values kept in a cache
// (GPT::decode), where re-running the window would cost block_size positions.
//
//   nn::SampleOptions o;  o.tokens = 100;  o.temperature = 0.8f;  o.top_k = 40;
//   std::vector<std::int64_t> ids = nn::sample(model, prompt_ids, o,
//                                              [&](std::int64_t id) { show(id); });
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "hpm/nn/gpt.h"
#include "hpm/tensor/random.h"

namespace hpm::nn {

struct SampleOptions {
  std::int64_t tokens = 200;  // to draw
  float temperature = 0.8f;   // the logits are divided by it: finite and > 0
  std::int64_t top_k = 0;     // draw among the k likeliest (0: all)
  std::uint64_t seed = 0;     // of the draws
  // Only ids below this are drawn (0: the whole vocabulary): a model may be wider than its
  // tokenizer (a byte model padded past 256, as nanoGPT pads it), whose extra ids are never text.
  std::int64_t usable_vocab = 0;
  // Re-run the whole window for each token instead of the key/value cache (for comparison: the
  // same tokens, more work).
  bool no_cache = false;
};

// One draw from logits (V): divided by `temperature`, cut to the `top_k` largest (0: all), then
// softmax and a draw from `gen`.
std::int64_t draw_token(const Tensor& logits, float temperature, std::int64_t top_k,
                        Generator& gen);

// Draws options.tokens tokens after `prompt` (its last block_size tokens, when longer) from
// `model`, in eval mode and without gradients, on the device the model is on; `on_token` sees each
// id as it is drawn. Returns the drawn ids. Throws std::invalid_argument for an empty prompt, an
// id outside the vocabulary, or a temperature that is not finite and positive.
std::vector<std::int64_t> sample(GPT& model, std::vector<std::int64_t> prompt,
                                 const SampleOptions& options,
                                 const std::function<void(std::int64_t)>& on_token = {});

}  // namespace hpm::nn
