// The input pipeline alone on the transform of ../shared/peers/torch_dataloader.py: pad 4 and a
// random 28x28 crop, random flip, normalize, batch 128, one pass over the 60k training images.
//   build/bench/pipeline_bench [parallel_calls (-1 = AUTOTUNE)] [repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "hpm/data/input_pipeline.h"

int main(int argc, char** argv) {
  using namespace hpm::data;
  const int calls = argc > 1 ? std::atoi(argv[1]) : kAutotune;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const LabelledData train = load_mnist_split("/usr/share/datasets/fashion-mnist", "train");
  InputPipelineSpec spec;
  spec.shuffle_buffer = -1;
  spec.batch_size = 128;
  spec.drop_remainder = false;
  spec.parallel_calls = calls;
  spec.augment = {{"random_crop", 4, 28, 28, {}, {}}, {"random_flip", 0, 0, 0, {}, {}},
                  {"normalize", 0, 0, 0, {0.2860f}, {0.3530f}}};
  const Dataset d = build_input_pipeline(train, spec);
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    auto it = d.make_iterator(r);
    const auto t0 = std::chrono::steady_clock::now();
    Element e;
    std::int64_t n = 0;
    while (it->next(e)) n += e[0].size(0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(static_cast<double>(n) / s);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("{\"parallel_calls\": %d, \"elements_per_s\": %.0f, \"repeats\": %d}\n", calls,
              rates[rates.size() / 2], repeats);
  return 0;
}
