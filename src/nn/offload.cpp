#include "hpm/nn/offload.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <sstream>
#include <thread>

#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/node.h"
#include "hpm/nn/recompute.h"
#include "hpm/trace/trace.h"

namespace hpm::nn {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// The prefetch thread: runs copy jobs in the order asked, one at a time.

struct OffloadedSequential::Prefetcher {
  Prefetcher() : thread_([this] { loop(); }) {}
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  std::shared_future<void> submit(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    std::shared_future<void> done = task.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(task));
    }
    cv_.notify_one();
    return done;
  }

  OffloadStats stats() const {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }
  template <typename F>
  void update_stats(F&& f) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    f(stats_);
  }

 private:
  void loop() {
    trace::name_thread("offload prefetch");
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        // Jobs still queued at shutdown run anyway: a waiter may be blocked on one.
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stopping_ = false;
  mutable std::mutex stats_mu_;
  OffloadStats stats_;
  std::thread thread_;  // last: starts after everything it uses exists
};

namespace {

// One forward's offloaded storages, per unit, shared by that forward's boundary nodes.
class OffloadedStep {
 public:
  OffloadedStep(std::shared_ptr<OffloadedSequential::Prefetcher> prefetcher, std::size_t units)
      : prefetcher_(std::move(prefetcher)), groups_(units) {}

  void add(std::size_t unit, const std::shared_ptr<Storage>& storage, Device& home) {
    groups_[unit].storages.emplace_back(storage, &home);
  }

  // Starts bringing unit `u`'s storages back (once).
  void request(std::size_t u) {
    Group& g = groups_[u];
    if (g.job || g.storages.empty()) return;
    g.job = std::make_shared<CopyJob>();
    // Weak references: a storage the graph has let go of meanwhile need not come back.
    for (auto& [s, home] : g.storages) g.job->items.emplace_back(s, home);
    auto* prefetcher = prefetcher_.get();
    prefetcher_->submit([job = g.job, prefetcher] {
      if (!job->claimed.exchange(true)) job->run(*prefetcher);
    });
  }

  // Blocks until unit `u`'s storages are back; rethrows the copy's error (OutOfMemoryError).
  void wait(std::size_t u) {
    Group& g = groups_[u];
    if (g.storages.empty()) return;
    request(u);
    const auto t0 = Clock::now();
    {
      trace::Span span("wait for prefetch", "memory");
      // A copy the prefetch thread has not started yet (it was not scheduled in time) is done
      // here: waiting for the thread to wake up would only add its latency.
      const bool inline_copy = !g.job->claimed.exchange(true);
      if (inline_copy) g.job->run(*prefetcher_);
      prefetcher_->update_stats([&](OffloadStats& st) { st.copied_by_backward += inline_copy; });
      g.job->done.get();
    }
    const double seconds = since(t0);
    prefetcher_->update_stats([&](OffloadStats& st) { st.wait_seconds += seconds; });
    g.storages.clear();
  }

  ~OffloadedStep() {
    // A backward that stopped half-way leaves copies in flight; they must not outlive the step.
    for (auto& g : groups_) {
      if (!g.job) continue;
      if (!g.job->claimed.exchange(true)) g.job->run(*prefetcher_);  // nobody else will
      g.job->done.wait();
    }
  }

  OffloadedStep(const OffloadedStep&) = delete;
  OffloadedStep& operator=(const OffloadedStep&) = delete;

 private:
  // Copies one unit's storages back, once: on the prefetch thread or, if that has not started it
  // by the time backward needs them, on backward's thread (whoever claims it first).
  struct CopyJob {
    std::vector<std::pair<std::weak_ptr<Storage>, Device*>> items;
    std::atomic<bool> claimed{false};
    std::promise<void> promise;
    std::shared_future<void> done = promise.get_future().share();

    void run(OffloadedSequential::Prefetcher& prefetcher) {
      trace::Span span("prefetch", "memory");
      const auto t0 = Clock::now();
      std::uint64_t bytes = 0;
      try {
        for (const auto& [weak, home] : items) {
          if (std::shared_ptr<Storage> s = weak.lock()) {
            s->move_to(*home);
            bytes += s->bytes();
          }
        }
      } catch (...) {
        promise.set_exception(std::current_exception());
        return;
      }
      const double seconds = since(t0);
      prefetcher.update_stats([&](OffloadStats& st) {
        st.bytes_prefetched += bytes;
        st.prefetch_seconds += seconds;
      });
      promise.set_value();
    }
  };
  struct Group {
    // Strong while waiting on the host: the graph holds them too, and a storage that comes back
    // must still exist when its unit's backward reads it.
    std::vector<std::pair<std::shared_ptr<Storage>, Device*>> storages;
    std::shared_ptr<CopyJob> job;
  };
  std::shared_ptr<OffloadedSequential::Prefetcher> prefetcher_;
  std::vector<Group> groups_;
};

}  // namespace

OffloadedSequential::OffloadedSequential(const Sequential& model, OffloadOptions options)
    : options_(options), prefetcher_(std::make_shared<Prefetcher>()) {
  for (std::size_t i = 0; i < model.size(); ++i) push_back(model[i]);
  units_ = sequential_units(model);
  for (const auto& [begin, end] : units_) unit_modules_.push_back(model.slice(begin, end));
}

OffloadedSequential::~OffloadedSequential() = default;

std::string OffloadedSequential::extra_repr() const {
  return "offload_threshold_bytes=" + std::to_string(options_.threshold_bytes);
}

OffloadStats OffloadedSequential::stats() const { return prefetcher_->stats(); }

Tensor OffloadedSequential::forward(const Tensor& x) {
  if (!autograd::grad_enabled() || !is_training()) return Sequential::forward(x);
  const std::size_t n = units_.size();
  auto step = std::make_shared<OffloadedStep>(prefetcher_, n);
  Device& host = Device::host();
  Tensor h = x;
  std::vector<std::weak_ptr<Storage>> pending;  // allocated in forward, not yet moved
  for (std::size_t u = 0; u < n; ++u) {
    Tensor out;
    {
      AllocationLog log;
      out = unit_modules_[u]->forward(h);
      for (auto& w : log.take()) pending.push_back(std::move(w));
    }
    h = Tensor();  // from here only the graph holds the input, if backward needs it
    if (u + 1 < n) {
      trace::Span span("offload", "memory");
      const auto t0 = Clock::now();
      std::uint64_t bytes = 0, count = 0;
      std::vector<std::weak_ptr<Storage>> next;
      for (auto& w : pending) {
        std::shared_ptr<Storage> s = w.lock();
        if (!s) continue;                // a temporary: already freed
        if (s == out.impl()->storage) {  // the next unit's input: moves after it
          next.push_back(std::move(w));
          continue;
        }
        if (s->bytes() < options_.threshold_bytes || &s->device() == &host) continue;
        Device& home = s->device();
        s->move_to(host);
        step->add(u, s, home);
        bytes += s->bytes();
        ++count;
      }
      pending = std::move(next);
      const double seconds = since(t0);
      prefetcher_->update_stats([&](OffloadStats& st) {
        st.storages_offloaded += count;
        st.bytes_offloaded += bytes;
        st.offload_seconds += seconds;
      });
    }
    // Backward reaches this identity just before unit u's own backward.
    h = autograd::record("OffloadBoundary", {out}, out.detach(),
                         [step, u](const Tensor& grad, const std::vector<bool>&) {
                           step->wait(u);
                           if (u > 0) step->request(u - 1);
                           return autograd::Tensors{grad};
                         });
  }
  return h;
}

std::shared_ptr<OffloadedSequential> with_offload(std::shared_ptr<Sequential> model,
                                                  OffloadOptions options) {
  if (!model) throw std::invalid_argument("with_offload: no model");
  return std::make_shared<OffloadedSequential>(*model, options);
}

}  // namespace hpm::nn
