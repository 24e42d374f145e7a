#include "tensor/backend/cuda/lt_autotune.h"

#include <algorithm>

#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

constexpr int kTimedRuns = 3;  // the median of three: one slow run (a clock step) does not decide

// Timing events, destroyed however the timing ends.
class Events {
 public:
  explicit Events(std::size_t n) {
    events_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      cudaEvent_t e = nullptr;
      HPM_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  ~Events() {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  cudaEvent_t operator[](std::size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

}  // namespace

bool lt_autotune_on() {
  static const bool on = opt_in_switch_on("HPM_CUDA_LT_AUTOTUNE");
  return on;
}

std::vector<float> time_candidates(int count, const std::function<bool(int)>& launch) {
  std::vector<float> ms(static_cast<std::size_t>(std::max(count, 0)), -1.0f);
  if (count <= 0) return ms;
  const cudaStream_t stream = current_stream();
  const auto runs = static_cast<std::size_t>(kTimedRuns);
  Events events(ms.size() * runs * 2);  // a start and an end for each timed run
  std::vector<bool> ran(ms.size(), false);
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (!launch(static_cast<int>(i))) continue;  // the warm-up: also where a refusal shows
    ran[i] = true;
    for (std::size_t r = 0; r < runs && ran[i]; ++r) {
      HPM_CUDA_CHECK(cudaEventRecord(events[(i * runs + r) * 2], stream));
      ran[i] = launch(static_cast<int>(i));  // a refusal now would time nothing as fastest
      HPM_CUDA_CHECK(cudaEventRecord(events[(i * runs + r) * 2 + 1], stream));
    }
  }
  HPM_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (!ran[i]) continue;
    float t[kTimedRuns];
    for (std::size_t r = 0; r < runs; ++r) {
      HPM_CUDA_CHECK(
          cudaEventElapsedTime(&t[r], events[(i * runs + r) * 2], events[(i * runs + r) * 2 + 1]));
    }
    std::sort(t, t + kTimedRuns);
    ms[i] = t[kTimedRuns / 2];
  }
  return ms;
}

int fastest(const std::vector<float>& ms) {
  int best = -1;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (ms[i] >= 0.0f && (best < 0 || ms[i] < ms[static_cast<std::size_t>(best)])) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

}  // namespace hpm::cuda
