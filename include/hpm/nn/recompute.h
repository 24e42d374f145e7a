// Recomputation (gradient checkpointing, GPipe's re-materialization; Chen et al. 2016): a
// checkpointed module keeps only its input after forward and drops its inner activations; its
// backward re-runs the forward with gradients on and backpropagates through the re-run. Memory for
// activations falls from every layer's to one segment's plus the segment inputs, at the price of
// one more forward (about a third of a step).
//
//   auto model = nn::with_recomputation(build_model(), /*every=*/2, nn::RecomputeMode::Always);
//
// The re-run sees the same numbers as the first run: the calling thread's default generator is
// put back to its state at the first run (so Dropout draws the same masks), and BatchNorm, which
// sees recomputing() set, neither updates its running statistics nor counts the batch a second
// time. Gradients are therefore bit-identical with and without recomputation. The inner backward
// accumulates parameter gradients into the same leaves, once per parameter, so the gradient
// reducer's hooks fire as they would without recomputation.
//
// Limits: a Dropout given a generator of its own (not the thread's default) is not replayed; a
// module whose forward depends on other hidden state must be left out.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpm/nn/module.h"

namespace hpm::nn {

// As torchgpipe names them. In a pipeline, ExceptLast skips recomputation for the last
// micro-batch (its backward starts at once); outside a pipeline it checkpoints every segment but
// the last, whose activations backward needs first anyway.
enum class RecomputeMode { Never, Always, ExceptLast };

// "never" | "always" | "except_last"; throws std::invalid_argument naming the text and the choices.
RecomputeMode parse_recompute_mode(const std::string& text);
std::string to_string(RecomputeMode mode);

// True on the calling thread while a recomputation re-runs a forward for backward.
bool recomputing();

// module.forward(x) without keeping its inner activations; backward re-runs it (same RNG state,
// grad on) and backpropagates through the re-run. Without grad mode it is module.forward(x).
// (PyTorch's torch.utils.checkpoint; named apart from saved checkpoints.)
Tensor forward_recomputed(Module& module, const Tensor& x);

// The units a Sequential runs as one step: [begin, end) layer ranges, where a Conv2d followed by a
// ReLU is one unit (Sequential fuses them). Segments and offload groups never split a unit.
std::vector<std::pair<std::size_t, std::size_t>> sequential_units(const Sequential& model);

// A Sequential whose layers are grouped into segments of `every` layers (units, as above), each
// run through forward_recomputed() per `mode`. It holds the same layers under the same names, so
// its state_dict and checkpoints are the model's. every >= 1 (std::invalid_argument otherwise).
std::shared_ptr<Module> with_recomputation(std::shared_ptr<Sequential> model, int every,
                                           RecomputeMode mode);

}  // namespace hpm::nn
