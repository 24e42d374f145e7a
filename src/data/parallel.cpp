// The threaded stages: map with num_parallel_calls, and prefetch. Both keep results in a queue of
// slots in input order (tf.data's invocation results); a slot carries the element or the error
// that producing it raised, so errors reach the consumer in order and with their origin.
//
// Input iterators are not thread-safe: workers call input->next() under the stage's mutex, one at
// a time, and run the map function outside it. save() waits until no call is in flight, then
// records the finished slots and the input's state, so restoring reproduces the same sequence.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <fstream>
#include <mutex>
#include <thread>

#include "fusion.h"
#include "hpm/data/dataset.h"
#include "hpm/trace/trace.h"
#include "stack.h"

namespace hpm::data {

namespace {

using Clock = std::chrono::steady_clock;

struct Slot {
  bool done = false;
  bool end = false;  // the input was exhausted here
  Element value;
  std::string error_origin, error_message;  // set when producing the element failed
};

void save_slot(StateWriter& w, const Slot& s) {
  w.u64(s.end);
  w.str(s.error_origin);
  w.str(s.error_message);
  w.tensors(s.value);
}

Slot restore_slot(StateReader& r) {
  Slot s;
  s.done = true;
  s.end = r.u64() != 0;
  s.error_origin = r.str();
  s.error_message = r.str();
  s.value = r.tensors();
  return s;
}

int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

std::int64_t half_available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::int64_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024 / 2;
  }
  return std::int64_t{1} << 30;
}

std::mutex budget_mu;
AutotuneBudget budget_setting;
std::atomic<std::int64_t> ram_reserved{0};

// Autotune tuning windows: long enough to average jitter, short enough to react within an epoch.
constexpr std::int64_t kWindowElements = 4;
constexpr double kWindowSeconds = 0.005;
constexpr double kInputBound = 0.05;  // grow while the consumer waits more than this share

// Shared machinery: a pool of producer threads that each take the next input element in order,
// transform it (or not), and complete its slot.
class SlotPipeline : public Iterator {
 public:
  // With `autotune`, `threads` and `max_buffered` are the limits and the stage starts at one
  // worker and the given starting buffer, growing while the consumer waits on it.
  SlotPipeline(std::unique_ptr<Iterator> input, std::string stage, int threads,
               std::int64_t max_buffered, bool deterministic, bool autotune_threads = false,
               bool autotune_buffer = false)
      : input_(std::move(input)),
        stage_(std::move(stage)),
        threads_(threads),
        active_(autotune_threads ? 1 : threads),
        max_buffered_(max_buffered),
        deterministic_(deterministic),
        autotune_threads_(autotune_threads),
        autotune_buffer_(autotune_buffer) {}

  // Derived classes call shutdown() in their destructors, before their members (the map
  // function) go; this one is a backstop.
  ~SlotPipeline() override { shutdown(); }

  bool next(Element& out) override {
    const auto t0 = Clock::now();
    std::unique_lock lock(mu_);
    start_threads_locked();
    if (window_start_ == Clock::time_point{}) window_start_ = t0;
    occupancy_sum_ += static_cast<double>(slots_.size()) / static_cast<double>(max_buffered_);
    ++requests_;
    for (;;) {
      // The first finished slot we may hand out: the front, or any when not deterministic.
      auto it = slots_.end();
      if (!slots_.empty() && slots_.front()->done) {
        it = slots_.begin();
      } else if (!deterministic_) {
        for (auto s = slots_.begin(); s != slots_.end(); ++s)
          if ((*s)->done && !(*s)->end) {
            it = s;
            break;
          }
      }
      if (it != slots_.end()) {
        std::shared_ptr<Slot> s = *it;
        if (s->end) {
          // Leave the end marker in place: every later call also sees the end.
          return false;
        }
        slots_.erase(it);
        ++produced_;
        const auto now = Clock::now();
        const double waited = std::chrono::duration<double>(now - t0).count();
        wait_seconds_ += waited;
        window_wait_ += waited;
        ++window_count_;
        if (s->error_message.empty()) note_element_bytes(s->value);
        maybe_tune(now);
        cv_.notify_all();
        if (!s->error_message.empty()) throw DataError(s->error_origin, s->error_message, true);
        out = std::move(s->value);
        return true;
      }
      cv_.wait(lock);
    }
  }

  void warm_up() override {
    std::lock_guard lock(mu_);
    start_threads_locked();
  }

  void save(StateWriter& w) override {
    std::unique_lock lock(mu_);
    paused_ = true;
    cv_.wait(lock, [&] { return in_flight_ == 0; });
    w.tag(stage_);
    w.u64(slots_.size());
    for (const auto& s : slots_) save_slot(w, *s);
    input_->save(w);
    paused_ = false;
    cv_.notify_all();
  }

  void restore(StateReader& r) override {
    std::unique_lock lock(mu_);
    paused_ = true;
    cv_.wait(lock, [&] { return in_flight_ == 0; });
    r.expect_tag(stage_);
    slots_.clear();
    const std::uint64_t n = r.u64();
    for (std::uint64_t i = 0; i < n; ++i) slots_.push_back(std::make_shared<Slot>(restore_slot(r)));
    input_ended_ = !slots_.empty() && slots_.back()->end;
    input_->restore(r);
    paused_ = false;
    cv_.notify_all();
  }

  void stats(std::vector<StageStats>& out) const override {
    input_->stats(out);
    std::lock_guard lock(mu_);
    StageStats s;
    s.name = stage_;
    s.elements = produced_;
    s.seconds_per_element = completed_ ? work_seconds_ / static_cast<double>(completed_) : 0.0;
    s.parallelism = active_;
    s.buffer_size = max_buffered_;
    s.buffer_occupancy = requests_ ? occupancy_sum_ / static_cast<double>(requests_) : 0.0;
    const double life = std::chrono::duration<double>(Clock::now() - first_request_).count();
    s.wait_fraction = requests_ && life > 0 ? std::min(1.0, wait_seconds_ / life) : 0.0;
    s.autotuned = autotune_threads_ || autotune_buffer_;
    out.push_back(s);
  }

 protected:
  // Takes the inputs of one output from `input` (called under the stage's lock, so in order);
  // false when there are none left.
  virtual bool pull(Iterator& input, std::vector<Element>& items) {
    items.resize(1);
    return input.next(items[0]);
  }
  // Turns the pulled inputs into the output element (outside the lock; may throw).
  virtual Element transform(std::vector<Element> in) = 0;

 protected:
  void shutdown_workers() {
    shutdown();
    ram_reserved -= reserved_bytes_;
    reserved_bytes_ = 0;
  }

 private:
  void note_element_bytes(const Element& e) {
    std::int64_t bytes = 0;
    for (const auto& t : e) bytes += static_cast<std::int64_t>(t.nbytes());
    element_bytes_ = std::max(element_bytes_, bytes);
  }

  // The AUTOTUNE model: per window, the share of the consumer's time spent waiting here. Above
  // kInputBound the stage is the bottleneck: add a worker (within the CPU budget) or, for a
  // buffering stage, a slot (within the RAM budget, counting this stage's largest element).
  void maybe_tune(Clock::time_point now) {
    if (!autotune_threads_ && !autotune_buffer_) return;
    const double window = std::chrono::duration<double>(now - window_start_).count();
    if (window_count_ < kWindowElements || window < kWindowSeconds) return;
    const bool input_bound = window_wait_ / window > kInputBound;
    window_start_ = now;
    window_wait_ = 0;
    window_count_ = 0;
    // The first window holds thread start-up and the first element's latency: not a steady state.
    if (windows_++ == 0 || !input_bound) return;
    if (autotune_threads_ && active_ < threads_) {
      ++active_;
      if (max_buffered_ < 2 * active_) grow_buffer(2 * active_ - max_buffered_);
      cv_.notify_all();
      return;
    }
    if (autotune_buffer_ && max_buffered_ < buffer_limit_) grow_buffer(1);
  }

  void grow_buffer(std::int64_t slots) {
    const std::int64_t cost = slots * std::max<std::int64_t>(element_bytes_, 1);
    if (ram_reserved.load() + cost > autotune_budget().ram_bytes) return;  // keep to the RAM budget
    ram_reserved += cost;
    reserved_bytes_ += cost;
    max_buffered_ += slots;
    cv_.notify_all();
  }

  void start_threads_locked() {
    if (started_) return;
    started_ = true;
    first_request_ = Clock::now();
    for (int i = 0; i < threads_; ++i) workers_.emplace_back([this, i] { work(i); });
  }

  void shutdown() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  // Pulling holds only input_mu_ (lock order: input_mu_, then mu_), so while one worker runs a
  // slow input (prefetch's whole upstream pipeline), consumers keep taking finished slots. A slot
  // is reserved while input_mu_ is held, so slot order is input order.
  void work(int index) {
    if (trace::enabled()) trace::name_thread(stage_ + " worker " + std::to_string(index));
    auto may_pull = [&] {
      return !paused_ && !input_ended_ && index < active_ &&
             static_cast<std::int64_t>(slots_.size()) < max_buffered_;
    };
    for (;;) {
      {
        // Wait without input_mu_: an idle worker must not hold up the active ones.
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || may_pull(); });
        if (stopping_) return;
      }
      std::unique_lock in_lock(input_mu_);
      std::unique_lock lock(mu_);
      if (stopping_) return;
      if (!may_pull()) continue;  // things changed while we waited for input_mu_
      auto slot = std::make_shared<Slot>();
      slots_.push_back(slot);
      ++in_flight_;
      lock.unlock();

      std::vector<Element> in;
      bool have = false;
      std::string origin, message;
      try {
        have = pull(*input_, in);
      } catch (const DataError& e) {
        origin = e.origin();
        message = e.what();
      } catch (const std::exception& e) {
        origin = stage_;
        message = stage_ + ": " + e.what();
      }
      if (!have || !message.empty()) {
        lock.lock();  // still holding input_mu_: no other worker pulls past the end
        if (!message.empty()) {
          slot->error_origin = std::move(origin);
          slot->error_message = std::move(message);
        } else {
          slot->end = true;
          input_ended_ = true;
        }
        slot->done = true;
        --in_flight_;
        cv_.notify_all();
        continue;
      }
      in_lock.unlock();

      const auto t0 = Clock::now();
      Element result;
      try {
        trace::Span span(stage_ == "prefetch" ? "prefetch" : "map", "transform");
        result = transform(std::move(in));
      } catch (const DataError& e) {
        origin = e.origin();
        message = e.what();
      } catch (const std::exception& e) {
        origin = stage_;
        message = stage_ + ": " + e.what();
      }
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      lock.lock();
      slot->value = std::move(result);
      slot->error_origin = std::move(origin);
      slot->error_message = std::move(message);
      slot->done = true;
      work_seconds_ += dt;
      ++completed_;
      --in_flight_;
      cv_.notify_all();
    }
  }

  std::unique_ptr<Iterator> input_;
  std::string stage_;
  int threads_;  // workers started (the most AUTOTUNE may use)
  int active_;   // workers allowed to run
  std::int64_t max_buffered_;
  bool deterministic_;
  bool autotune_threads_, autotune_buffer_;
  std::int64_t buffer_limit_ = 1 << 20;  // slots; the RAM budget binds first
  std::int64_t element_bytes_ = 0, reserved_bytes_ = 0;
  Clock::time_point window_start_{}, first_request_{};
  double window_wait_ = 0;
  std::int64_t window_count_ = 0, windows_ = 0;

  std::mutex input_mu_;  // serializes input_->next() among workers
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Slot>> slots_;
  std::vector<std::thread> workers_;
  bool started_ = false, stopping_ = false, paused_ = false, input_ended_ = false;
  int in_flight_ = 0;
  // stats
  std::int64_t produced_ = 0, completed_ = 0, requests_ = 0;
  double work_seconds_ = 0, wait_seconds_ = 0, occupancy_sum_ = 0;
};

class ParallelMapIt : public SlotPipeline {
 public:
  ParallelMapIt(std::unique_ptr<Iterator> input, MapFn fn, int threads, bool deterministic,
                bool autotune)
      : SlotPipeline(std::move(input), "map", threads, autotune ? 2 : 2 * threads, deterministic,
                     autotune),
        fn_(std::move(fn)) {}
  // Workers must stop before fn_ is destroyed.
  ~ParallelMapIt() override { shutdown_workers(); }

 protected:
  Element transform(std::vector<Element> in) override { return fn_(std::move(in[0])); }

 private:
  MapFn fn_;
};

// map followed by batch, fused (tf.data's map_and_batch_fusion): a worker pulls a whole batch of
// inputs, maps and stacks them, so threads synchronize once per batch instead of per element.
class MapAndBatchIt : public SlotPipeline {
 public:
  MapAndBatchIt(std::unique_ptr<Iterator> input, MapFn fn, int threads, bool deterministic,
                std::int64_t batch, bool drop_remainder, bool autotune)
      : SlotPipeline(std::move(input), "map_and_batch", threads, autotune ? 2 : 2 * threads,
                     deterministic, autotune),
        fn_(std::move(fn)),
        batch_(batch),
        drop_(drop_remainder) {}
  ~MapAndBatchIt() override { shutdown_workers(); }

 protected:
  bool pull(Iterator& input, std::vector<Element>& items) override {
    items.clear();
    Element e;
    while (static_cast<std::int64_t>(items.size()) < batch_ && input.next(e))
      items.push_back(std::move(e));
    if (items.empty() || (drop_ && static_cast<std::int64_t>(items.size()) < batch_)) return false;
    return true;
  }
  Element transform(std::vector<Element> in) override {
    for (auto& e : in) e = fn_(std::move(e));
    return stack_elements(in, false, 0.0f, "map_and_batch");
  }

 private:
  MapFn fn_;
  std::int64_t batch_;
  bool drop_;
};

class PrefetchIt : public SlotPipeline {
 public:
  PrefetchIt(std::unique_ptr<Iterator> input, std::int64_t buffer, bool autotune)
      : SlotPipeline(std::move(input), "prefetch", 1, buffer, true, false, autotune) {}
  ~PrefetchIt() override { shutdown_workers(); }

 protected:
  Element transform(std::vector<Element> in) override { return std::move(in[0]); }
};

class SequentialMapIt : public Iterator {
 public:
  SequentialMapIt(std::unique_ptr<Iterator> input, MapFn fn)
      : input_(std::move(input)), fn_(std::move(fn)) {}
  bool next(Element& out) override {
    Element in;
    if (!input_->next(in)) return false;
    const auto t0 = Clock::now();
    try {
      trace::Span span("map", "transform");
      out = fn_(std::move(in));
    } catch (const DataError&) {
      throw;
    } catch (const std::exception& e) {
      throw DataError("map", e.what());
    }
    seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    ++count_;
    return true;
  }
  void save(StateWriter& w) override {
    w.tag("map");
    input_->save(w);
  }
  void restore(StateReader& r) override {
    r.expect_tag("map");
    input_->restore(r);
  }
  void stats(std::vector<StageStats>& out) const override {
    input_->stats(out);
    StageStats s;
    s.name = "map";
    s.elements = count_;
    s.seconds_per_element = count_ ? seconds_ / static_cast<double>(count_) : 0.0;
    out.push_back(s);
  }

 private:
  std::unique_ptr<Iterator> input_;
  MapFn fn_;
  std::int64_t count_ = 0;
  double seconds_ = 0;
};

class MapAndBatchNode : public DatasetNode {
 public:
  MapAndBatchNode(Dataset input, MapFn fn, MapOptions o, std::int64_t batch, bool drop)
      : input_(std::move(input)), fn_(std::move(fn)), o_(o), batch_(batch), drop_(drop) {}
  std::int64_t cardinality() const override {
    const std::int64_t c = input_.cardinality();
    if (c < 0) return c;
    return drop_ ? c / batch_ : (c + batch_ - 1) / batch_;
  }
  std::string name() const override { return "map_and_batch"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    const bool autotune = o_.num_parallel_calls == kAutotune;
    const int threads = autotune ? autotune_budget().cpu : o_.num_parallel_calls;
    return std::make_unique<MapAndBatchIt>(input_.make_iterator(epoch), fn_, threads,
                                           o_.deterministic, batch_, drop_, autotune);
  }

 private:
  Dataset input_;
  MapFn fn_;
  MapOptions o_;
  std::int64_t batch_;
  bool drop_;
};

class MapNode : public DatasetNode {
 public:
  MapNode(Dataset input, MapFn fn, MapOptions o)
      : input_(std::move(input)), fn_(std::move(fn)), o_(o) {}
  bool parallel() const { return o_.num_parallel_calls == kAutotune || o_.num_parallel_calls > 1; }
  Dataset fused_with_batch(std::int64_t batch, bool drop) const {
    return Dataset(std::make_shared<MapAndBatchNode>(input_, fn_, o_, batch, drop));
  }
  std::int64_t cardinality() const override { return input_.cardinality(); }
  std::string name() const override { return "map"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    const bool autotune = o_.num_parallel_calls == kAutotune;
    const int threads = autotune ? autotune_budget().cpu : o_.num_parallel_calls;
    if (threads <= 1 && !autotune)
      return std::make_unique<SequentialMapIt>(input_.make_iterator(epoch), fn_);
    return std::make_unique<ParallelMapIt>(input_.make_iterator(epoch), fn_, threads,
                                           o_.deterministic, autotune);
  }

 private:
  Dataset input_;
  MapFn fn_;
  MapOptions o_;
};

class PrefetchNode : public DatasetNode {
 public:
  PrefetchNode(Dataset input, std::int64_t buffer) : input_(std::move(input)), buffer_(buffer) {}
  std::int64_t cardinality() const override { return input_.cardinality(); }
  std::string name() const override { return "prefetch"; }
  std::unique_ptr<Iterator> make_iterator(std::int64_t epoch) const override {
    // AUTOTUNE starts with one slot and grows while the consumer waits (SlotPipeline::maybe_tune).
    const bool autotune = buffer_ == kAutotune;
    return std::make_unique<PrefetchIt>(input_.make_iterator(epoch), autotune ? 1 : buffer_,
                                        autotune);
  }

 private:
  Dataset input_;
  std::int64_t buffer_;
};

}  // namespace

void set_autotune_budget(const AutotuneBudget& budget) {
  std::lock_guard lock(budget_mu);
  budget_setting = budget;
}

AutotuneBudget autotune_budget() {
  std::lock_guard lock(budget_mu);
  AutotuneBudget b = budget_setting;
  if (b.cpu <= 0) b.cpu = hardware_threads();
  if (b.ram_bytes <= 0) b.ram_bytes = half_available_memory();
  return b;
}

std::int64_t autotune_ram_in_use() { return ram_reserved.load(); }

std::optional<Dataset> fuse_map_and_batch(const DatasetNode& node, std::int64_t batch, bool drop) {
  const auto* map = dynamic_cast<const MapNode*>(&node);
  if (map == nullptr || !map->parallel()) return std::nullopt;
  return map->fused_with_batch(batch, drop);
}

Dataset Dataset::map(MapFn fn, MapOptions options) const {
  if (options.num_parallel_calls == 0 || options.num_parallel_calls < kAutotune) {
    throw std::invalid_argument("map: num_parallel_calls must be positive or kAutotune");
  }
  return Dataset(std::make_shared<MapNode>(*this, std::move(fn), options));
}

Dataset Dataset::prefetch(std::int64_t buffer_size) const {
  if (buffer_size == 0 || buffer_size < kAutotune) {
    throw std::invalid_argument("prefetch: buffer_size must be positive or kAutotune");
  }
  return Dataset(std::make_shared<PrefetchNode>(*this, buffer_size));
}

}  // namespace hpm::data
