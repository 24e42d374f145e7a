#include "hpm/distribute/ps/worker.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "distribute/ps/rpc.h"
#include "hpm/autograd/ops.h"
#include "hpm/distribute/replica_step.h"
#include "hpm/nn/losses.h"
#include "hpm/nn/objective.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::distribute::ps {

using Clock = std::chrono::steady_clock;

std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  Generator gen(seed * 1000003u + static_cast<std::uint64_t>(epoch) + 17u);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(gen.below(static_cast<std::uint64_t>(i + 1)));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

std::int64_t tasks_per_epoch(std::int64_t n, std::int64_t batch_size, int parts) {
  const std::int64_t steps = n / (batch_size * parts);
  if (steps < 1) {
    throw PsError("the training set (" + std::to_string(n) + " rows) holds no whole step of " +
                  std::to_string(parts) + " x " + std::to_string(batch_size) + " rows");
  }
  return steps * parts;
}

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace

struct Worker::Impl {
  Cluster cluster;
  WorkerOptions o;
  std::shared_ptr<nn::Module> model;
  data::LabelledData train;
  std::unique_ptr<rpc::Coordinator::Stub> coordinator;
  std::unique_ptr<PsClient> ps;
  nn::NamedTensors params;
  std::int64_t cached_epoch = -1;
  std::vector<std::int64_t> order;
  // statistics
  std::int64_t steps = 0, failed = 0;
  std::vector<double> pull_ms, push_ms;
  std::vector<std::int64_t> staleness = std::vector<std::int64_t>(17, 0);
  Clock::time_point start;

  void fill_stats(rpc::WorkerStats* s) const {
    s->set_worker(o.worker);
    s->set_steps(steps);
    s->set_seconds(std::chrono::duration<double>(Clock::now() - start).count());
    for (auto c : staleness) s->add_staleness_histogram(c);
    s->set_pull_ms_mean(mean(pull_ms));
    s->set_pull_ms_p50(percentile(pull_ms, 0.5));
    s->set_pull_ms_p99(percentile(pull_ms, 0.99));
    s->set_push_ms_mean(mean(push_ms));
    s->set_push_ms_p50(percentile(push_ms, 0.5));
    s->set_push_ms_p99(percentile(push_ms, 0.99));
    s->set_failed_tasks(failed);
  }

  WorkerReport report() const {
    rpc::WorkerStats s;
    fill_stats(&s);
    WorkerReport r;
    r.worker = o.worker;
    r.steps = steps;
    r.seconds = s.seconds();
    r.staleness_histogram = staleness;
    r.pull_ms_p50 = s.pull_ms_p50();
    r.pull_ms_p99 = s.pull_ms_p99();
    r.push_ms_p50 = s.push_ms_p50();
    r.push_ms_p99 = s.push_ms_p99();
    r.failed_tasks = failed;
    return r;
  }

  // Pull, forward and backward, push. Fills loss/correct/samples; false when a call failed.
  bool run_task(const rpc::NextReply& task, rpc::NextRequest* out) {
    if (task.epoch() != cached_epoch) {
      order = epoch_order(train.size(), o.seed, task.epoch());
      cached_epoch = task.epoch();
    }
    const std::int64_t first = task.batch() * o.batch_size;
    if (first + o.batch_size > train.size()) {
      throw PsError("task " + std::to_string(task.task()) + " asks for rows beyond the " +
                    std::to_string(train.size()) + " of this worker's training set");
    }
    const std::vector<std::int64_t> rows(order.begin() + first,
                                         order.begin() + first + o.batch_size);
    try {
      auto t0 = Clock::now();
      const std::vector<std::int64_t> versions = ps->pull(params);
      auto t1 = Clock::now();
      pull_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());

      const Tensor x = kernels::index_select0(train.inputs, rows);
      const Tensor y = kernels::index_select0(train.labels, rows);
      model->zero_grad();
      const nn::Classification classify(o.label_smoothing);
      const nn::Objective& objective = o.objective ? *o.objective : classify;
      ReplicaStepOptions step_options;
      step_options.precision = o.precision;
      step_options.micro_batches = o.accumulation_steps;
      const ReplicaStepResult step = replica_step(*model, objective, nn::Batch{x, y}, step_options);
      if (!step.finite) {
        throw PsError("worker " + std::to_string(o.worker) + ": the loss of task " +
                      std::to_string(task.task()) + " is not finite");
      }
      std::vector<Tensor> grads;
      for (const auto& [name, p] : params) {
        if (is_buffer_variable(name)) {  // its new value: what this forward left in the buffer
          grads.push_back(p);
          continue;
        }
        Tensor g = p.grad();
        grads.push_back(g.defined() ? g : Tensor::zeros(p.shape()));
      }
      auto t2 = Clock::now();
      if (o.slow_factor > 1.0) {
        std::this_thread::sleep_for((t2 - t1) * (o.slow_factor - 1.0));
      }
      auto t3 = Clock::now();
      const PushOutcome pushed =
          ps->push(grads, task.task(), o.worker, versions, task.step(), task.part(), task.lr());
      push_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t3).count());
      const auto bucket = std::min<std::int64_t>(std::max<std::int64_t>(pushed.staleness, 0),
                                                 static_cast<std::int64_t>(staleness.size()) - 1);
      ++staleness[static_cast<std::size_t>(bucket)];
      ++steps;
      out->set_loss_sum(step.metrics.sum("loss"));
      out->set_correct(std::llround(step.metrics.sum("accuracy")));
      out->set_samples(o.batch_size);
      return true;
    } catch (const PsError& e) {
      if (std::string(e.what()).find("not finite") != std::string::npos) throw;
      ++failed;
      std::fprintf(stderr, "worker %d: task %lld failed: %s\n", o.worker,
                   static_cast<long long>(task.task()), e.what());
      return false;
    }
  }
};

Worker::Worker(const Cluster& cluster, std::shared_ptr<nn::Module> model, data::LabelledData train,
               const WorkerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cluster = cluster;
  m.o = options;
  m.model = std::move(model);
  m.train = std::move(train);
  m.params = ps_variables(*m.model);  // parameters, then buffers (pulled, and pushed as values)
  std::vector<std::string> names;
  std::vector<std::int64_t> numels;
  for (const auto& [name, t] : m.params) {
    names.push_back(name);
    numels.push_back(t.numel());
  }
  m.ps = std::make_unique<PsClient>(cluster, names, numels);
  m.coordinator = rpc::Coordinator::NewStub(make_channel(cluster, cluster.coordinator));
}

Worker::~Worker() = default;

WorkerReport Worker::run() {
  Impl& m = *impl_;
  m.start = Clock::now();
  std::mt19937_64 rng(std::random_device{}());
  const auto incarnation = static_cast<std::int64_t>(rng() | 1);
  rpc::NextRequest req;
  req.set_worker(m.o.worker);
  req.set_incarnation(incarnation);
  req.set_done_task(-1);
  auto last_answer = Clock::now();
  for (;;) {
    m.fill_stats(req.mutable_stats());
    rpc::NextReply reply;
    grpc::ClientContext ctx;
    prepare(ctx, m.cluster);
    const grpc::Status st = m.coordinator->Next(&ctx, req, &reply);
    if (!st.ok()) {
      if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
          st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
          Clock::now() - last_answer > m.o.coordinator_timeout) {
        throw PsError(describe("worker " + std::to_string(m.o.worker) + ": the coordinator at",
                               m.cluster.coordinator, st));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;  // the same request again: its report is not lost
    }
    last_answer = Clock::now();
    req = rpc::NextRequest();
    req.set_worker(m.o.worker);
    req.set_incarnation(incarnation);
    req.set_done_task(-1);
    if (reply.kind() == rpc::NextReply::DONE) break;
    if (reply.kind() == rpc::NextReply::WAIT) continue;
    if (m.steps == 0 && m.failed == 0) m.start = Clock::now();  // steps/s from the first task
    const bool ok = m.run_task(reply, &req);
    req.set_done_task(reply.task());
    req.set_failed(!ok);
    if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return m.report();
}

}  // namespace hpm::distribute::ps
