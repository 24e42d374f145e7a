// Choosing a product's algorithm by timing it. cuBLASLt's heuristic ranks its algorithms by a
// model of the card, and a product takes the first. Under HPM_CUDA_LT_AUTOTUNE=1 a product's plan
// instead times the heuristic's first few candidates on the product's own operands the first time
// it meets the shape, and keeps the fastest, as torch.backends.cudnn.benchmark does for
// convolutions. The price: a host wait and a few runs of the product at each shape's first call
// (a training step's warm-up), and that the algorithm, so the result's last bits where candidates
// sum in different orders, can differ from one run of a program to the next. Off by default: a
// product then takes the heuristic's first, the same every run. Each tuned shape is reported once
// on stderr ("hpm: cuBLASLt autotune ..."), the heuristic's first against the fastest in TFLOP/s:
// what a card's run says about how far algorithm choice moves each shape.
#pragma once
#include <functional>
#include <vector>

namespace hpm::cuda {

// HPM_CUDA_LT_AUTOTUNE=1 (read once).
bool lt_autotune_on();

// Runs `launch(i)` for each candidate i < count on the current device's compute stream, once to
// warm up and then kTimedRuns times between events, and waits for them. launch returns false when
// the candidate refuses the call (it is then not timed). Returns each candidate's median time in
// milliseconds, negative for one that refused.
std::vector<float> time_candidates(int count, const std::function<bool(int)>& launch);

// The index of the smallest non-negative time; -1 when every candidate refused.
int fastest(const std::vector<float>& ms);

}  // namespace hpm::cuda
