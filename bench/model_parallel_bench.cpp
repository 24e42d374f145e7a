// Pipeline parallelism on this machine, side by side in one run, as markdown tables:
//   1. throughput of a balanced 2-stage pipeline (M = 8; GPipe, 1F1B, interleaved, ZB-H1) against
//   one
//      Device training the unsplit model on the same mini-batches (medians over --repeats);
//   1b. what micro-batching costs one stage, each stage's busy time, and how much longer the
//       stages compute when they run at once (overhead);
//   1c. what two cores give at best: two independent copies at once (ceiling);
//   2. the measured idle share (bubble) for K = 2 and M in 1, 4, 8, 16 against (K-1)/(M+K-1),
//      and the simulator's predicted step time (from the run's own chunk times, and from
//      `hpm plan`'s per-layer profile) against the measured one;
//   3. each stage's peak memory (Device accounting) for GPipe and 1F1B as M grows with the
//      micro-batch size fixed;
//   4. --timeline-dir DIR: SVG and Chrome-trace timelines of one step, naive model parallelism
//      (M = 1), GPipe, 1F1B and interleaved (the seeds' Figures 7-4 and 7-5, from real runs).
//
//   build/bench/model_parallel_bench --repeats 5 --timeline-dir docs [--parts speed,bubble,...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hpm/distribute/strategy.h"
#include "hpm/io/atomic_file.h"
#include "hpm/nn/layers.h"
#include "hpm/pipeline/partition.h"
#include "hpm/pipeline/simulator.h"
#include "hpm/pipeline/strategy.h"
#include "hpm/tensor/random.h"
#include "hpm/trace/trace.h"

namespace hpm {
namespace {

using Clock = std::chrono::steady_clock;
using pipeline::ScheduleKind;

// A deep mlp whose two halves cost the same: the first Linear computes no input gradient (2 of
// a hidden layer's 3 GEMMs, at 784/1024 the width), so the second half ends in a 1024 -> 512
// layer of the same cost. 784-1024-1024-1024 | 1024-1024-512-10, each half ~7.5 hidden GEMMs.
// (The repo's cnn is 85% one convolution: no 2-stage cut balances it.)
std::shared_ptr<nn::Module> deep_mlp() {
  Generator g(11);
  std::vector<std::shared_ptr<nn::Module>> layers{std::make_shared<nn::Flatten>(),
                                                  std::make_shared<nn::Linear>(784, 1024, true, g)};
  for (int i = 0; i < 4; ++i) {
    layers.push_back(std::make_shared<nn::ReLU>());
    layers.push_back(std::make_shared<nn::Linear>(1024, 1024, true, g));
  }
  layers.push_back(std::make_shared<nn::ReLU>());
  layers.push_back(std::make_shared<nn::Linear>(1024, 512, true, g));
  layers.push_back(std::make_shared<nn::ReLU>());
  layers.push_back(std::make_shared<nn::Linear>(512, 10, true, g));
  return std::make_shared<nn::Sequential>(layers);
}

std::shared_ptr<optim::Optimizer> sgd(nn::Module& m) {
  return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.01f, 0.9f});
}

Tensor loss_fn(const Tensor& logits, const Tensor& labels) { return cross_entropy(logits, labels); }

struct Batch {
  Tensor x, y;
};

Batch batch(std::int64_t n) {
  Generator g(3);
  Batch b{Tensor::uniform({n, 1, 28, 28}, g, 0.0f, 1.0f), Tensor::zeros({n}, DType::I64)};
  for (std::int64_t i = 0; i < n; ++i)
    b.y.data<std::int64_t>()[i] = static_cast<std::int64_t>(g.below(10));
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::shared_ptr<distribute::Strategy> make(ScheduleKind kind, int m, int v = 1, int stages = 2) {
  pipeline::PipelineStrategyOptions o;
  o.pipeline.stages = stages;
  o.pipeline.micro_batches = m;
  o.pipeline.schedule = kind;
  o.pipeline.chunks_per_stage = v;
  o.partition = pipeline::PartitionMethod::kBalanced;
  auto s = pipeline::make_pipeline(o);
  s->scope(deep_mlp, sgd);
  return s;
}

// Median seconds per step over `steps` steps after one warm-up step.
double step_time(distribute::Strategy& s, const Batch& b, int steps) {
  s.train_step(b.x, b.y, loss_fn, 0.0f);
  std::vector<double> t;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    s.train_step(b.x, b.y, loss_fn, 0.0f);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

void speed(int repeats, std::int64_t rows) {
  const Batch b = batch(rows);
  struct Row {
    const char* name;
    ScheduleKind kind;
    int v;
    std::vector<double> ratio;
  };
  std::vector<Row> rows_out{{"GPipe", ScheduleKind::kGPipe, 1, {}},
                            {"1F1B", ScheduleKind::kOneFOneB, 1, {}},
                            {"interleaved v=2", ScheduleKind::kInterleaved, 2, {}},
                            {"ZB-H1", ScheduleKind::kZeroBubbleH1, 1, {}}};
  std::vector<double> one_ms;
  for (int r = 0; r < repeats; ++r) {
    // One device first in every repeat, the pipelines right after: same machine state.
    auto one = distribute::make_one_device();
    one->scope(deep_mlp, sgd);
    const double t1 = step_time(*one, b, 5);
    one_ms.push_back(t1 * 1e3);
    for (Row& row : rows_out) {
      auto s = make(row.kind, 8, row.v);
      row.ratio.push_back(t1 / step_time(*s, b, 5));
    }
  }
  std::printf(
      "\n### Throughput: 2 stages, M = 8, batch %lld, against one Device (medians of %d)\n\n",
      static_cast<long long>(rows), repeats);
  std::printf("| schedule | throughput / one Device | theory (1 - bubble) x 2 |\n|---|---|---|\n");
  for (const Row& row : rows_out) {
    const pipeline::Schedule s = pipeline::make_schedule(row.kind, 2, 8, row.v);
    std::printf("| %s | %.2fx | %.2fx |\n", row.name, median(row.ratio),
                2 * (1 - pipeline::theoretical_bubble(s)));
  }
  std::printf("\none Device step: median %.1f ms\n", median(one_ms));
}

// What two busy cores give here at best: two independent copies of the one-Device step, one per
// core, at the same time. Both cores share the L3, the memory bus and the package's clock budget,
// so each copy runs slower than alone; 2 x alone / together is the most any 2-stage split can
// reach on this machine before its bubble.
void ceiling(int repeats, std::int64_t rows) {
  const Batch b = batch(rows);
  std::vector<double> slowdown;
  for (int r = 0; r < repeats; ++r) {
    auto alone = distribute::make_one_device();
    alone->scope(deep_mlp, sgd);
    const double t_alone = step_time(*alone, b, 5);
    std::vector<double> together(2);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        set_num_threads(1);
        auto one = distribute::make_one_device();
        one->scope(deep_mlp, sgd);
        together[static_cast<std::size_t>(i)] = step_time(*one, b, 5);
      });
    }
    for (std::thread& t : threads) t.join();
    slowdown.push_back((together[0] + together[1]) / 2 / t_alone);
  }
  const double s = median(slowdown);
  std::printf("\n### Two cores at once, batch %lld (medians of %d)\n\n",
              static_cast<long long>(rows), repeats);
  std::printf(
      "two independent one-Device copies at once: each step %.2fx its time alone, so two cores "
      "give at most %.2fx one (x 8/9 for a 2-stage M = 8 bubble: %.2fx)\n",
      s, 2 / s, 2 / s * 8 / 9);
}

// Where a 2-stage pipeline's time goes besides the bubble: one stage running the batch as 8
// micro-batches against the unsplit step (what micro-batching costs by itself), and each stage's
// busy time in a 2-stage step (the cut's imbalance).
void overhead(int repeats, std::int64_t rows) {
  const Batch b = batch(rows);
  std::vector<double> micro_ratio, fwd_ratio, bwd_ratio, busy0, busy1, inflation;
  for (int r = 0; r < repeats; ++r) {
    auto whole = make(ScheduleKind::kGPipe, 1, 1, 1);
    auto split = make(ScheduleKind::kGPipe, 8, 1, 1);
    const double t_whole = step_time(*whole, b, 3), t_split = step_time(*split, b, 3);
    micro_ratio.push_back(t_split / t_whole);
    const auto& cw = pipeline::pipeline_report(*whole)->last_step.chunk_costs[0];
    const auto& cs = pipeline::pipeline_report(*split)->last_step.chunk_costs[0];
    fwd_ratio.push_back(8 * cs.forward_s / cw.forward_s);
    bwd_ratio.push_back(8 * cs.backward_s / cw.backward_s);
    auto two = make(ScheduleKind::kGPipe, 8);
    step_time(*two, b, 3);
    const auto& busy = pipeline::pipeline_report(*two)->last_step.busy_s;
    busy0.push_back(busy[0]);
    busy1.push_back(busy[1]);
    step_time(*split, b, 3);
    inflation.push_back((busy[0] + busy[1]) /
                        pipeline::pipeline_report(*split)->last_step.busy_s[0]);
    if (r == 0) {
      const pipeline::PipelineReport& rep = *pipeline::pipeline_report(*two);
      std::printf("%s", pipeline::describe(rep.partition, rep.layers).c_str());
    }
  }
  std::printf("\n### Where the time goes, batch %lld (medians of %d)\n\n",
              static_cast<long long>(rows), repeats);
  std::printf(
      "| one stage, M = 8, over the unsplit step | forward | backward | 2 stages, M = 8: busy "
      "stage 0 | busy stage 1 | both stages' busy / one stage's "
      "|\n|---|---|---|---|---|---|\n");
  std::printf("| %.2fx | %.2fx | %.2fx | %.1f ms | %.1f ms | %.2fx |\n", median(micro_ratio),
              median(fwd_ratio), median(bwd_ratio), 1e3 * median(busy0), 1e3 * median(busy1),
              median(inflation));
}

void bubble(int repeats, std::int64_t rows) {
  const Batch b = batch(rows);
  std::printf("\n### Bubble, K = 2, batch %lld (medians of %d)\n\n", static_cast<long long>(rows),
              repeats);
  std::printf(
      "| schedule | M | measured bubble | formula | simulated (run's chunk times) | measured step "
      "| simulated step / measured | `hpm plan` step / measured "
      "|\n|---|---|---|---|---|---|---|---|\n");
  struct Case {
    ScheduleKind kind;
    int m, v;
  };
  for (const Case c : std::vector<Case>{{ScheduleKind::kGPipe, 1, 1},
                                        {ScheduleKind::kGPipe, 4, 1},
                                        {ScheduleKind::kGPipe, 8, 1},
                                        {ScheduleKind::kGPipe, 16, 1},
                                        {ScheduleKind::kOneFOneB, 4, 1},
                                        {ScheduleKind::kOneFOneB, 8, 1},
                                        {ScheduleKind::kOneFOneB, 16, 1},
                                        {ScheduleKind::kInterleaved, 4, 2},
                                        {ScheduleKind::kInterleaved, 8, 2},
                                        {ScheduleKind::kInterleaved, 16, 2},
                                        {ScheduleKind::kZeroBubbleH1, 4, 1},
                                        {ScheduleKind::kZeroBubbleH1, 8, 1},
                                        {ScheduleKind::kZeroBubbleH1, 16, 1}}) {
    std::vector<double> measured, simulated, step, sim_ratio, plan_ratio;
    for (int r = 0; r < repeats; ++r) {
      auto s = make(c.kind, c.m, c.v);
      s->train_step(b.x, b.y, loss_fn, 0.0f);
      s->train_step(b.x, b.y, loss_fn, 0.0f);
      const pipeline::PipelineReport& rep = *pipeline::pipeline_report(*s);
      const pipeline::StepStats& st = rep.last_step;
      const pipeline::Schedule sched = pipeline::make_schedule(c.kind, 2, c.m, c.v);
      const pipeline::Simulation sim = pipeline::simulate(sched, st.chunk_costs);
      const pipeline::Simulation plan =
          pipeline::simulate(sched, pipeline::chunk_costs(rep.layers, rep.partition.boundaries));
      measured.push_back(st.bubble);
      simulated.push_back(sim.bubble);
      step.push_back(st.wall_s);
      sim_ratio.push_back(sim.step_s / st.wall_s);
      plan_ratio.push_back(plan.step_s / st.wall_s);
    }
    const pipeline::Schedule sched = pipeline::make_schedule(c.kind, 2, c.m, c.v);
    std::printf("| %s%s | %d | %.3f | %.3f | %.3f | %.1f ms | %.3f | %.3f |\n",
                pipeline::schedule_name(c.kind), c.v > 1 ? " v=2" : "", c.m, median(measured),
                pipeline::theoretical_bubble(sched), median(simulated), 1e3 * median(step),
                median(sim_ratio), median(plan_ratio));
  }
}

void memory(std::int64_t rows_per_micro) {
  std::printf("\n### Peak memory per stage (MiB, Device accounting), %lld rows per micro-batch\n\n",
              static_cast<long long>(rows_per_micro));
  std::printf(
      "| M | GPipe stage 0 | GPipe stage 1 | 1F1B stage 0 | 1F1B stage 1 "
      "|\n|---|---|---|---|---|\n");
  for (int m : {1, 2, 4, 8, 16}) {
    const Batch b = batch(rows_per_micro * m);
    std::printf("| %d |", m);
    for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
      auto s = make(kind, m);
      s->train_step(b.x, b.y, loss_fn, 0.0f);
      s->train_step(b.x, b.y, loss_fn, 0.0f);
      for (std::size_t peak : pipeline::pipeline_report(*s)->last_step.peak_bytes) {
        std::printf(" %.2f |", static_cast<double>(peak) / (1024.0 * 1024.0));
      }
    }
    std::printf("\n");
  }
}

void timelines(const std::string& dir, std::int64_t rows) {
  const Batch b = batch(rows);
  struct Fig {
    const char* file;
    const char* title;
    ScheduleKind kind;
    int m, v;
  };
  for (const Fig& f :
       std::vector<Fig>{{"pipeline_naive", "Naive model parallelism: 2 stages, one batch (M = 1)",
                         ScheduleKind::kGPipe, 1, 1},
                        {"pipeline_gpipe", "GPipe: 2 stages, M = 4", ScheduleKind::kGPipe, 4, 1},
                        {"pipeline_1f1b", "1F1B: 2 stages, M = 4", ScheduleKind::kOneFOneB, 4, 1},
                        {"pipeline_interleaved", "Interleaved 1F1B: 2 stages x 2 chunks, M = 4",
                         ScheduleKind::kInterleaved, 4, 2},
                        {"pipeline_zbh1", "ZB-H1: 2 stages, M = 4, backward split into B and W",
                         ScheduleKind::kZeroBubbleH1, 4, 1}}) {
    auto s = make(f.kind, f.m, f.v);
    s->train_step(b.x, b.y, loss_fn, 0.0f);  // warm-up and partition, not drawn
    trace::start();
    s->train_step(b.x, b.y, loss_fn, 0.0f);
    trace::stop();
    std::vector<trace::Event> events;
    for (const auto& e : trace::events()) {
      if (e.category == "forward" || e.category == "backward" || e.category == "weight") {
        events.push_back(e);
      }
    }
    io::write_file_atomic(dir + "/" + f.file + ".svg", trace::svg(events, f.title, 900));
    io::write_file_atomic(dir + "/" + f.file + ".json", trace::chrome_json(events));
    std::printf("wrote %s/%s.svg and .json\n", dir.c_str(), f.file);
  }
}

}  // namespace
}  // namespace hpm

int main(int argc, char** argv) {
  int repeats = 5;
  std::string timeline_dir;
  std::int64_t rows = 2048;
  std::string parts = "speed,overhead,ceiling,bubble,memory,timelines";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--parts" && i + 1 < argc) {
      parts = argv[++i];
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--timeline-dir" && i + 1 < argc) {
      timeline_dir = argv[++i];
    } else if (a == "--batch" && i + 1 < argc) {
      rows = std::max(16, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--repeats N] [--batch ROWS] [--timeline-dir DIR]\n",
                   argv[0]);
      return 2;
    }
  }
  hpm::set_num_threads(1);
  std::printf(
      "model: deep mlp (784-1024-1024-1024-1024-1024-512-10), one kernel thread per stage\n");
  auto wanted = [&](const char* part) { return parts.find(part) != std::string::npos; };
  if (wanted("speed")) hpm::speed(repeats, rows);
  if (wanted("overhead")) hpm::overhead(repeats, rows);
  if (wanted("ceiling")) hpm::ceiling(repeats, rows);

  if (wanted("bubble")) hpm::bubble(repeats, rows);
  if (wanted("memory")) hpm::memory(32);
  if (wanted("timelines") && !timeline_dir.empty()) hpm::timelines(timeline_dir, rows);
  return 0;
}
