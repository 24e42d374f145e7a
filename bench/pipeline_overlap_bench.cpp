// The seeds' ETL figures, measured: a slow source (the tf.data guide's ArtificialDataset: 10 ms to
// open a file, 1 ms to read each record), 1 ms of CPU transform per element and a 5 ms training
// step (a sleep, as an accelerator would be busy while the host waits), under four settings:
// sequential, prefetch, prefetch + parallel interleave and map, and AUTOTUNE. Prints per setting
// the step time and the share of time the training loop waited for data (input-bound %).
// Then cache(): an expensive map, two passes, the second from the in-memory cache.
// With --timeline DIR it also traces the sequential and the AUTOTUNE runs and writes the seeds'
// Figures 7-2 and 7-3 from the measurements: DIR/timeline_{sequential,pipelined}.{svg,json}.
//   build/bench/pipeline_overlap_bench [steps] [--timeline DIR]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "hpm/data/dataset.h"
#include "hpm/io/atomic_file.h"
#include "hpm/trace/trace.h"

namespace {

using namespace hpm;
using namespace hpm::data;
using Clock = std::chrono::steady_clock;

constexpr int kFiles = 16, kRecordsPerFile = 16;

void spin(std::chrono::microseconds d) {
  const auto end = Clock::now() + d;
  volatile double x = 1.0;
  while (Clock::now() < end) x = x * 1.0000001 + 1e-9;
}

Dataset artificial_file(std::int64_t file) {
  return Dataset::from_generator(
      [file](std::int64_t i, Element& out) {
        if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // open
        if (i >= kRecordsPerFile) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // read one record
        out = {Tensor::from_i64(std::vector<std::int64_t>{file * 1000 + i}, Shape{})};
        return true;
      },
      kRecordsPerFile);
}

Element transform(Element e) {
  spin(std::chrono::microseconds(1000));
  return e;
}

struct Setting {
  const char* name;
  int interleave_calls, map_calls;
  std::int64_t prefetch;  // 0 none
};

void run(const Setting& s, int steps, const std::string& timeline = "", const std::string& file = "") {
  Dataset d = Dataset::range(0, kFiles)
                  .interleave([](const Element& e) { return artificial_file(e[0].to_vector_i64()[0]); }, 4, 1,
                              s.interleave_calls)
                  .map(transform, MapOptions{s.map_calls, true});
  if (s.prefetch != 0) d = d.prefetch(s.prefetch);
  if (!timeline.empty()) {
    trace::start();
    trace::name_thread("training loop");
  }
  auto it = d.make_iterator();
  Element e;
  double waited = 0;
  const auto t0 = Clock::now();
  int n = 0;
  for (; n < steps; ++n) {
    const auto w0 = Clock::now();
    bool got = false;
    {
      trace::Span span("next", "load");
      got = it->next(e);
    }
    if (!got) break;
    waited += std::chrono::duration<double>(Clock::now() - w0).count();
    trace::Span step("train step", "train");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the training step
  }
  if (!timeline.empty()) {
    trace::stop();
    const auto evs = trace::events();
    io::write_file_atomic(timeline + "/" + file + ".json", trace::chrome_json(evs));
    io::write_file_atomic(timeline + "/" + file + ".svg",
                          trace::svg(evs, std::string("hpm input pipeline, ") + s.name + ": " + std::to_string(n) +
                                              " steps (extract 1 ms/record + 10 ms/open, transform 1 ms, train 5 ms)"));
  }
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("{\"setting\": \"%s\", \"steps\": %d, \"step_ms\": %.2f, \"input_bound_pct\": %.1f}\n", s.name, n,
              1e3 * total / n, 100.0 * waited / total);
  std::fflush(stdout);
}

void cache_bench() {
  const Dataset d = Dataset::range(0, 400)
                        .map([](Element e) {
                          spin(std::chrono::microseconds(500));
                          return e;
                        })
                        .cache();
  double seconds[2];
  for (int epoch = 0; epoch < 2; ++epoch) {
    auto it = d.make_iterator(epoch);
    Element e;
    const auto t0 = Clock::now();
    while (it->next(e)) {
    }
    seconds[epoch] = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::printf("{\"cache_first_pass_ms\": %.1f, \"cache_second_pass_ms\": %.2f, \"speedup\": %.0f}\n",
              1e3 * seconds[0], 1e3 * seconds[1], seconds[0] / seconds[1]);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200;
  std::string timeline;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--timeline" && i + 1 < argc) {
      timeline = argv[++i];
    } else {
      steps = std::atoi(argv[i]);
    }
  }
  if (!timeline.empty()) {
    io::ensure_directory(timeline);
    run(Setting{"sequential", 1, 1, 0}, 24, timeline, "timeline_sequential");
    run(Setting{"autotune", kAutotune, kAutotune, kAutotune}, 24, timeline, "timeline_pipelined");
  }
  for (const Setting& s : {Setting{"sequential", 1, 1, 0}, Setting{"prefetch", 1, 1, 2},
                           Setting{"prefetch+parallel interleave and map", 4, 2, 2},
                           Setting{"autotune", kAutotune, kAutotune, kAutotune}}) {
    run(s, steps);
  }
  cache_bench();
  return 0;
}
