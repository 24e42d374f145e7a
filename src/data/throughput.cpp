// measure_throughput: a pipeline drained alone, timed.
#include <chrono>

#include "hpm/data/dataset.h"

namespace hpm::data {

PipelineThroughput measure_throughput(const Dataset& pipeline, std::int64_t epochs) {
  PipelineThroughput t;
  for (std::int64_t epoch = 0; epoch < epochs; ++epoch) {
    auto it = pipeline.make_iterator(epoch);
    const auto t0 = std::chrono::steady_clock::now();
    Element e;
    while (it->next(e)) {
      t.elements += e.empty() ? 0 : e[0].size(0);
      ++t.batches;
    }
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.stages.clear();
    it->stats(t.stages);
  }
  return t;
}

}  // namespace hpm::data
