#include "hpm/pipeline/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include "hpm/autograd/deferred.h"
#include "hpm/autograd/weight_cast.h"
#include "hpm/comm/local.h"
#include "hpm/distribute/replica_step.h"
#include "hpm/nn/losses.h"
#include "hpm/tensor/random.h"
#include "hpm/trace/trace.h"

namespace hpm::pipeline {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kHeaderLength = 8;  // rank, then up to 7 dimensions (I64)

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Rows of micro-batch i when `rows` are split into `m` parts as evenly as possible.
std::pair<std::int64_t, std::int64_t> micro_rows(std::int64_t rows, int m, int i) {
  const std::int64_t base = rows / m, extra = rows % m;
  const std::int64_t first = i * base + std::min<std::int64_t>(i, extra);
  return {first, base + (i < extra ? 1 : 0)};
}

std::size_t state_bytes(const nn::Module& m) {
  std::size_t bytes = 0;
  for (const auto& [name, t] : m.state_dict()) bytes += t.nbytes();
  return bytes;
}

}  // namespace

std::vector<std::shared_ptr<nn::Module>> cut(const nn::Sequential& model,
                                             const std::vector<int>& b) {
  if (b.size() < 2 || b.front() != 0 || b.back() != static_cast<int>(model.size())) {
    throw std::invalid_argument("pipeline: cut points must run from 0 to the model's " +
                                std::to_string(model.size()) + " layers");
  }
  std::vector<std::shared_ptr<nn::Module>> out;
  for (std::size_t i = 0; i + 1 < b.size(); ++i) {
    if (b[i + 1] <= b[i]) {
      throw std::invalid_argument("pipeline: chunk " + std::to_string(i) +
                                  " would be empty (cut points " + std::to_string(b[i]) + ", " +
                                  std::to_string(b[i + 1]) + ")");
    }
    out.push_back(model.slice(static_cast<std::size_t>(b[i]), static_cast<std::size_t>(b[i + 1])));
  }
  return out;
}

// Whether every chunk runs its forwards, and its backwards, in micro-batch order on every device:
// then each stream of messages (an edge, forward or backward) is sent and received in that order,
// which receiving ahead relies on (Stage::receive).
bool streams_in_micro_order(const Schedule& s) {
  for (const std::vector<Action>& actions : s.per_device) {
    std::map<std::pair<int, int>, int> next;  // (chunk, kind) -> the micro-batch due
    for (const Action& a : actions) {
      if (a.kind == Action::kWeight) continue;
      if (a.micro != next[{a.chunk, a.kind}]++) return false;
    }
  }
  return true;
}

namespace {

// Devices that stopped stages could not free (a message of theirs still in flight, whose buffer
// the communicator releases later): reachable, so that no leak checker reports them, and never
// destroyed.
void keep_alive(std::unique_ptr<Device> device) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::unique_ptr<Device>>();
  const std::lock_guard lock(mu);
  kept->push_back(std::move(device));
}

}  // namespace

// One device of the pipeline: its Device, generator and communicator, and the bookkeeping of
// one mini-batch (micro-batch activations kept from forward to backward, messages in flight).
class Pipeline::Stage {
 public:
  // `first_local_stage`: the lowest stage this process runs (0 when every stage is a thread).
  Stage(int index, int first_local_stage, const PipelineOptions& o, const Schedule& s,
        const std::vector<std::shared_ptr<nn::Module>>& chunks, comm::CommunicatorPtr comm)
      : index_(index),
        options_(o),
        schedule_(s),
        chunks_(chunks),
        owned_device_(std::make_unique<Device>("stage" + std::to_string(index), o.device_budget,
                                               o.threads_per_stage)),
        device_(*owned_device_),
        generator_(o.seed + 7919 * static_cast<std::uint64_t>(index + 1)),
        comm_(std::move(comm)),
        receive_ahead_(streams_in_micro_order(s)) {
    // A stage's variables live on its Device: the budget covers them, as a GPU's would. A tied
    // weight that an earlier stage of this process also uses stays on that stage's Device (one
    // copy, one owner).
    std::set<const TensorImpl*> earlier;
    for (int c = 0; c < s.chunks(); ++c) {
      if (s.device_of(c) >= index || s.device_of(c) < first_local_stage) continue;
      for (const auto& [name, t] : chunks[static_cast<std::size_t>(c)]->state_dict())
        earlier.insert(t.impl());
    }
    for (int c = index; c < s.chunks(); c += s.devices) {
      for (auto& [name, t] : chunks[static_cast<std::size_t>(c)]->state_dict()) {
        if (earlier.count(t.impl())) {
          tied_.push_back(t);
          continue;
        }
        home_ = &t.device();
        t.impl()->storage->move_to(device_);
        variables_.push_back(t);
      }
    }
  }

  // The model outlives its pipeline: its variables and their gradients go back where they came
  // from before this Device goes away. A tied weight's gradient may have been allocated here
  // (backward reaches the last stage first), though the weight lives on an earlier stage: it
  // follows the weight, wherever that is by now.
  ~Stage() {
    // Gloo cannot withdraw a receive (communicator.h): one still posted when a stop or a failure
    // ends the pipeline lets go of its buffer only when the communicator goes, after this stage.
    // Its memory must then go back to a live allocator: this Device is kept, holding nothing but
    // those buffers.
    const bool in_flight = !settle();
    for (Tensor& t : tied_) {
      if (t.requires_grad() && t.grad().defined() && &t.grad().device() == &device_) {
        t.grad().impl()->storage->move_to(t.device());
      }
    }
    if (home_ != nullptr) {
      for (Tensor& t : variables_) {
        t.impl()->storage->move_to(*home_);
        if (t.requires_grad() && t.grad().defined() && &t.grad().device() == &device_) {
          t.grad().impl()->storage->move_to(*home_);
        }
      }
    }
    if (in_flight) {
      saved_.clear();
      deferred_.clear();
      local_mail_.clear();
      ahead_.clear();
      sends_.clear();
      x_ = y_ = Tensor();
      device_.empty_cache();
      keep_alive(std::move(owned_device_));
    }
  }
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  Device& device() { return device_; }
  // Lets go of the communicator: a local group may hold a receive buffer of a failed step, which
  // lives on one of the stages' Devices and must go before they do.
  void release_communicator() { comm_.reset(); }

  struct Result {
    nn::Metrics metrics;
    bool finite = true;
    double busy_s = 0;
    // chunk -> (sum, count); backward_s is B alone where a W follows
    std::map<int, std::pair<double, int>> forward_s, backward_s, weight_s;
    std::map<int, std::size_t> activation_bytes;  // chunk -> largest seen
    std::size_t peak_bytes = 0;
  };

  Result run(const nn::Batch& batch, const nn::Objective& objective,
             const std::atomic<bool>& abort) {
    DeviceGuard on_device(device_);
    ThreadGeneratorGuard with_generator(generator_);
    const autograd::AutocastScope precision(options_.precision);
    const autograd::Bf16OutputsScope outputs_as_read(objective.reads_bf16_outputs());
    const autograd::WeightCastScope weights_once;  // no parameter changes until the optimizer's
    set_num_threads(options_.threads_per_stage);
    if (trace::enabled()) trace::name_thread("stage " + std::to_string(index_));
    device_.reset_peak();
    abort_ = &abort;
    result_ = Result{};
    ahead_.clear();
    sent_shapes_.clear();
    rows_ = batch.rows();
    x_ = batch.inputs;
    y_ = batch.targets;
    objective_ = &objective;
    step_weight_ = objective.weight(batch);
    for (const Action& a : schedule_.per_device[static_cast<std::size_t>(index_)]) {
      try {
        if (a.kind == Action::kForward) {
          forward(a);
        } else if (a.kind == Action::kBackward) {
          backward(a);
        } else {
          weight(a);
        }
      } catch (const OutOfMemoryError& e) {
        // Say where in the schedule the budget ran out, and what would lower the need.
        throw OutOfMemoryError("pipeline stage " + std::to_string(index_) + " at " +
                               describe(a, schedule_) + " (chunk " + std::to_string(a.chunk) +
                               "): " + e.what() + " (peak so far " +
                               std::to_string(device_.stats().peak_bytes) +
                               " bytes); more stages, more micro-batches or the 1f1b schedule "
                               "need less per stage");
      }
    }
    for (auto& [work, buffer] : sends_) wait(*work, "send");
    sends_.clear();
    saved_.clear();
    ahead_.clear();
    sent_shapes_.clear();
    deferred_.clear();
    local_mail_.clear();
    x_ = y_ = Tensor();
    result_.peak_bytes = device_.stats().peak_bytes;
    return result_;
  }

 private:
  int last_chunk() const { return schedule_.chunks() - 1; }

  void forward(const Action& a) {
    const auto [first, rows] = micro_rows(rows_, schedule_.micro_batches, a.micro);
    Tensor in;
    if (a.chunk == 0) {
      in = x_.narrow(first, rows).to(device_);
    } else {
      in = receive(a.micro, a.chunk - 1, /*gradient=*/false);
      in.set_requires_grad(true);
    }
    const std::size_t before = device_.stats().current_bytes;
    const Clock::time_point t0 = Clock::now();
    nn::Module& chunk = *chunks_[static_cast<std::size_t>(a.chunk)];
    const bool recompute = options_.recompute == nn::RecomputeMode::Always ||
                           (options_.recompute == nn::RecomputeMode::ExceptLast &&
                            a.micro != schedule_.micro_batches - 1);
    Tensor out = recompute ? nn::forward_recomputed(chunk, in) : chunk.forward(in);
    Tensor keep = out;
    if (a.chunk == last_chunk()) {
      // The one replica step's loss: each micro-batch's mean weighted by its share of the
      // mini-batch, so the gradients add up to the mini-batch mean's.
      const nn::Batch micro{x_.narrow(first, rows), y_.narrow(first, rows)};
      distribute::WeightedLoss w = distribute::weighted_loss(
          *objective_, out, micro, objective_->weight(micro) / step_weight_);
      if (!w.finite) result_.finite = false;
      result_.metrics.merge(w.metrics);
      keep = w.loss;
    }
    const Clock::time_point t1 = Clock::now();
    account(a, t0, t1, result_.forward_s);
    const std::size_t after = device_.stats().current_bytes;
    auto& bytes = result_.activation_bytes[a.chunk];
    bytes =
        std::max(bytes, (after > before ? after - before : 0) + (a.chunk > 0 ? in.nbytes() : 0));
    if (a.chunk != last_chunk()) transmit(out, a.micro, a.chunk, /*gradient=*/false);
    saved_[{a.micro, a.chunk}] = Saved{in, keep};
  }

  void backward(const Action& a) {
    auto it = saved_.find({a.micro, a.chunk});
    if (it == saved_.end()) {
      throw std::logic_error("pipeline schedule runs " + describe(a, schedule_) +
                             " before its forward on stage " + std::to_string(index_));
    }
    Saved s = std::move(it->second);
    saved_.erase(it);
    Tensor grad;
    if (a.chunk != last_chunk()) grad = receive(a.micro, a.chunk, /*gradient=*/true);
    const Clock::time_point t0 = Clock::now();
    // Split schedules: B computes the input gradient now, for the previous stage; the weight
    // gradients wait for W.
    std::optional<autograd::DeferWeightGradients> later;
    if (schedule_.splits_backward()) later.emplace(deferred_[{a.micro, a.chunk}]);
    // An output that needs no gradient has nothing to compute: a first chunk without parameters
    // (a flatten of the inputs, which need none). Its W then finds nothing deferred.
    if (s.out.requires_grad()) s.out.backward(grad);
    later.reset();
    const Clock::time_point t1 = Clock::now();
    account(a, t0, t1, result_.backward_s);
    if (a.chunk > 0) {
      Tensor g = s.in.grad();
      if (!g.defined()) g = Tensor::zeros(s.in.shape());  // the chunk ignores its input
      transmit(g, a.micro, a.chunk - 1, /*gradient=*/true);
    }
  }

  void weight(const Action& a) {
    auto it = deferred_.find({a.micro, a.chunk});
    if (it == deferred_.end()) {
      throw std::logic_error("pipeline schedule runs " + describe(a, schedule_) +
                             " before its backward on stage " + std::to_string(index_));
    }
    autograd::DeferredWeightGradients work = std::move(it->second);
    deferred_.erase(it);
    const Clock::time_point t0 = Clock::now();
    work.run();
    const Clock::time_point t1 = Clock::now();
    account(a, t0, t1, result_.weight_s);
  }

  void account(const Action& a, Clock::time_point t0, Clock::time_point t1,
               std::map<int, std::pair<double, int>>& per_chunk) {
    const double s = seconds(t0, t1);
    result_.busy_s += s;
    auto& [sum, count] = per_chunk[a.chunk];
    sum += s;
    ++count;
    if (trace::enabled()) {
      trace::record_span(describe(a, schedule_),
                         a.kind == Action::kForward    ? "forward"
                         : a.kind == Action::kBackward ? "backward"
                                                       : "weight",
                         t0, t1);
    }
  }

  // Messages between stages. Each is a header (the shape) and a payload, under tags of their own.
  // gloo writes a send only into a receive already posted: a receive posted when the data is due
  // waits for two round trips through the sender's communication thread, on a core busy
  // computing, and the interleaved schedule pays that 6 times per micro-batch. So on receiving
  // micro-batch m of a stream (an edge, forward or backward), a stage at once posts the receives
  // of m + 1, guessing its shape is m's when the two have as many rows. The sender makes the same
  // guess from the same schedule; when its payload has another shape after all (activations whose
  // shape follows the data), it fills the guessed receive with zeros and sends the payload again
  // under the retry tag.
  enum class Part { kPayload, kHeader, kRetry };

  // Edge e joins chunk e to chunk e + 1: activations cross it forward, gradients backward.
  int tag(int micro, int edge, bool gradient, Part part) const {
    return ((micro * schedule_.chunks() + edge) * 2 + (gradient ? 1 : 0)) * 3 +
           static_cast<int>(part);
  }

  // Whether micro-batch `micro` of every stream is received into receives posted ahead.
  bool received_ahead(int micro) const {
    const int m = schedule_.micro_batches;
    return receive_ahead_ && micro > 0 && micro < m &&
           micro_rows(rows_, m, micro).second == micro_rows(rows_, m, micro - 1).second;
  }

  void post_send(const Tensor& t, int dst, int tag) {
    sends_.emplace_back(track(comm_->send(t, dst, tag)), t);
  }

  // Every send and recv posted is kept until it completes: its buffer lives on device_, and a
  // communicator's thread still holding it when device_ goes would hand the memory back to a
  // dead allocator (a failed step, or a stop, leaves operations in flight).
  comm::WorkPtr track(comm::WorkPtr work) {
    std::erase_if(posted_, [](const comm::WorkPtr& w) { return w->completed(); });
    posted_.push_back(work);
    return work;
  }

  // Withdraws what is still in flight where the communicator can (a local group's receives);
  // true when no operation holds a buffer of this stage any more.
  bool settle() {
    for (const comm::WorkPtr& w : posted_) {
      if (!w->completed()) w->cancel();
    }
    std::erase_if(posted_, [](const comm::WorkPtr& w) { return w->completed(); });
    return posted_.empty();
  }

  void transmit(const Tensor& t, int micro, int edge, bool gradient) {
    const int dst = schedule_.device_of(gradient ? edge : edge + 1);
    if (dst == index_) {
      local_mail_[{micro, edge, gradient}] = t;
      return;
    }
    if (t.dim() > kHeaderLength - 1) {
      throw std::invalid_argument("pipeline: activations of rank " + std::to_string(t.dim()) +
                                  " cannot cross stages (at most 7 dimensions)");
    }
    std::vector<std::int64_t> h(kHeaderLength, 0);
    h[0] = t.dim();
    for (int d = 0; d < t.dim(); ++d) h[static_cast<std::size_t>(d) + 1] = t.size(d);
    // A send's buffer must outlive it; finished ones let go of theirs at once, or 1F1B would
    // hold every micro-batch's messages to the end of the step.
    std::erase_if(sends_, [](const auto& s) { return s.first->completed(); });
    post_send(Tensor::from_i64(h, {kHeaderLength}), dst, tag(micro, edge, gradient, Part::kHeader));
    Shape& previous = sent_shapes_[{edge, gradient}];  // micro - 1's: streams go in order
    if (received_ahead(micro) && !(t.shape() == previous)) {
      post_send(Tensor::zeros(previous), dst, tag(micro, edge, gradient, Part::kPayload));
      post_send(t, dst, tag(micro, edge, gradient, Part::kRetry));
    } else {
      post_send(t, dst, tag(micro, edge, gradient, Part::kPayload));
    }
    previous = t.shape();
  }

  struct Incoming {
    Tensor header, payload;  // payload: the guessed shape, when received ahead
    comm::WorkPtr header_done, payload_done;
  };

  Incoming post_receive(int src, int micro, int edge, bool gradient, const Shape* guess) {
    Incoming in;
    in.header = Tensor::empty({kHeaderLength}, DType::I64);
    in.header_done = track(comm_->recv(in.header, src, tag(micro, edge, gradient, Part::kHeader)));
    if (guess != nullptr) {
      in.payload = Tensor::empty(*guess);
      in.payload_done =
          track(comm_->recv(in.payload, src, tag(micro, edge, gradient, Part::kPayload)));
    }
    return in;
  }

  Tensor receive(int micro, int edge, bool gradient) {
    const int src = schedule_.device_of(gradient ? edge + 1 : edge);
    if (src == index_) {
      auto it = local_mail_.find({micro, edge, gradient});
      if (it == local_mail_.end()) {
        throw std::logic_error("pipeline: stage " + std::to_string(index_) +
                               " waits for its own message it never sent");
      }
      Tensor t = it->second;
      local_mail_.erase(it);
      return gradient ? t : t.detach();
    }
    Incoming in;
    if (auto it = ahead_.find({micro, edge, gradient}); it != ahead_.end()) {
      in = std::move(it->second);
      ahead_.erase(it);
    } else {
      in = post_receive(src, micro, edge, gradient, nullptr);
    }
    wait(*in.header_done, "recv");
    const std::vector<std::int64_t> h = in.header.to_vector_i64();
    const std::vector<std::int64_t> dims(h.begin() + 1, h.begin() + 1 + h[0]);
    const Shape shape(dims);
    Tensor data;
    if (in.payload_done) wait(*in.payload_done, "recv");
    if (in.payload_done && in.payload.shape() == shape) {
      data = in.payload;
    } else {
      data = Tensor::empty(shape);
      const Part part = in.payload_done ? Part::kRetry : Part::kPayload;
      wait(*track(comm_->recv(data, src, tag(micro, edge, gradient, part))), "recv");
    }
    if (received_ahead(micro + 1)) {
      ahead_[{micro + 1, edge, gradient}] = post_receive(src, micro + 1, edge, gradient, &shape);
    }
    return data;
  }

  // Waits in short slices so that a failure on another stage stops this one promptly instead of
  // after the whole timeout.
  void wait(comm::Work& work, const char* what) {
    const Clock::time_point deadline = Clock::now() + options_.timeout;
    for (;;) {
      if (work.wait_for(std::chrono::milliseconds(50))) return;  // throws if the operation failed
      if (abort_->load())
        throw comm::CommError("pipeline stage " + std::to_string(index_) +
                              ": stopped, another stage failed");
      if (Clock::now() >= deadline) {
        throw comm::CommError("pipeline stage " + std::to_string(index_) + ": " + what +
                              " timed out: " + work.what());
      }
    }
  }

  struct Saved {
    Tensor in, out;  // out: the chunk's output, or the last chunk's weighted loss
  };

  int index_;
  const PipelineOptions& options_;
  const Schedule& schedule_;
  const std::vector<std::shared_ptr<nn::Module>>& chunks_;
  // Declared before anything that holds its tensors, so that they go first.
  std::unique_ptr<Device> owned_device_;
  Device& device_;
  Device* home_ = nullptr;         // where the variables were before they moved here
  std::vector<Tensor> variables_;  // this stage's parameters and buffers
  std::vector<Tensor> tied_;       // used here, owned by an earlier stage of this process
  Generator generator_;
  comm::CommunicatorPtr comm_;

  const std::atomic<bool>* abort_ = nullptr;
  Result result_;
  std::int64_t rows_ = 0;
  Tensor x_, y_;
  const nn::Objective* objective_ = nullptr;
  double step_weight_ = 1;
  std::map<std::pair<int, int>, Saved> saved_;
  std::map<std::pair<int, int>, autograd::DeferredWeightGradients> deferred_;  // B done, W not
  std::map<std::tuple<int, int, bool>, Tensor> local_mail_;
  std::vector<std::pair<comm::WorkPtr, Tensor>> sends_;
  std::vector<comm::WorkPtr> posted_;  // sends and recvs not known to be complete
  const bool receive_ahead_;           // streams_in_micro_order(schedule_)
  std::map<std::tuple<int, int, bool>, Incoming> ahead_;  // (micro, edge, gradient)
  std::map<std::pair<int, int>, Shape> sent_shapes_;      // (edge, gradient) -> the last sent
};

// The stage threads of an in-process pipeline: each waits for a mini-batch, runs its stage and
// reports; the caller's thread waits for all of them.
struct Pipeline::Threads {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t generation = 0;
  int finished = 0;
  bool quit = false;
  std::function<void(int)> job;
  std::vector<std::thread> threads;
};

namespace {
void check_options(const PipelineOptions& o, std::size_t chunks) {
  if (o.stages < 1) throw std::invalid_argument("pipeline: stages must be >= 1");
  if (static_cast<int>(chunks) != o.stages * o.chunks_per_stage) {
    throw std::invalid_argument("pipeline: " + std::to_string(chunks) + " chunks for " +
                                std::to_string(o.stages) + " stages of " +
                                std::to_string(o.chunks_per_stage) + " chunk(s) each");
  }
}
}  // namespace

Pipeline::Pipeline(std::vector<std::shared_ptr<nn::Module>> chunks, const PipelineOptions& options)
    : options_(options),
      schedule_(make_schedule(options.schedule, options.stages, options.micro_batches,
                              options.chunks_per_stage)),
      chunks_(std::move(chunks)) {
  check_options(options_, chunks_.size());
  std::vector<comm::CommunicatorPtr> comms =
      comm::make_local_group(options_.stages, options_.timeout);
  for (int d = 0; d < options_.stages; ++d) {
    stages_.push_back(std::make_unique<Stage>(d, 0, options_, schedule_, chunks_,
                                              comms[static_cast<std::size_t>(d)]));
  }
  start_threads();
}

Pipeline::Pipeline(std::vector<std::shared_ptr<nn::Module>> chunks, const PipelineOptions& options,
                   comm::CommunicatorPtr comm)
    : options_(options),
      schedule_(make_schedule(options.schedule, options.stages, options.micro_batches,
                              options.chunks_per_stage)),
      chunks_(std::move(chunks)) {
  check_options(options_, chunks_.size());
  if (comm->size() != options_.stages) {
    throw std::invalid_argument("pipeline: " + std::to_string(options_.stages) +
                                " stages need as many processes, the communicator has " +
                                std::to_string(comm->size()));
  }
  stages_.resize(static_cast<std::size_t>(options_.stages));
  stages_[static_cast<std::size_t>(comm->rank())] =
      std::make_unique<Stage>(comm->rank(), comm->rank(), options_, schedule_, chunks_, comm);
}

void Pipeline::start_threads() {
  threads_ = std::make_unique<Threads>();
  for (int d = 0; d < options_.stages; ++d) {
    threads_->threads.emplace_back([this, d] {
      std::uint64_t seen = 0;
      for (;;) {
        std::function<void(int)> job;
        {
          std::unique_lock lock(threads_->mu);
          threads_->cv.wait(lock, [&] { return threads_->quit || threads_->generation != seen; });
          if (threads_->quit) return;
          seen = threads_->generation;
          job = threads_->job;
        }
        job(d);
        {
          std::lock_guard lock(threads_->mu);
          ++threads_->finished;
        }
        threads_->cv.notify_all();
      }
    });
  }
}

Pipeline::~Pipeline() {
  if (threads_) {
    {
      std::lock_guard lock(threads_->mu);
      threads_->quit = true;
    }
    threads_->cv.notify_all();
    for (auto& t : threads_->threads) t.join();
  }
  for (auto& stage : stages_) {
    if (stage) stage->release_communicator();
  }
  stages_.clear();
}

void Pipeline::run_on_stages(const std::function<void(int)>& job) {
  if (threads_) {
    {
      std::lock_guard lock(threads_->mu);
      threads_->job = job;
      threads_->finished = 0;
      ++threads_->generation;
    }
    threads_->cv.notify_all();
    std::unique_lock lock(threads_->mu);
    threads_->cv.wait(lock, [&] { return threads_->finished == options_.stages; });
    threads_->job = nullptr;
  } else {
    for (int d = 0; d < options_.stages; ++d) {
      if (owns(d)) job(d);
    }
  }
}

void Pipeline::on_stages(const std::function<void(int)>& job) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(options_.stages));
  run_on_stages([&](int d) {
    try {
      job(d);
    } catch (...) {
      errors[static_cast<std::size_t>(d)] = std::current_exception();
    }
  });
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

bool Pipeline::owns(int stage) const {
  return stage >= 0 && stage < options_.stages &&
         stages_[static_cast<std::size_t>(stage)] != nullptr;
}

Device& Pipeline::device(int stage) const {
  if (!owns(stage)) {
    throw std::out_of_range("pipeline: stage " + std::to_string(stage) + " is not in this process");
  }
  return stages_[static_cast<std::size_t>(stage)]->device();
}

StepStats Pipeline::forward_backward(const Tensor& x, const Tensor& y, const LossFn& loss) {
  const nn::FunctionObjective objective(
      [&loss](const Tensor& outputs, const Tensor&, const Tensor& targets) {
        return loss(outputs, targets);
      },
      "loss");
  return forward_backward(nn::Batch{x, y}, objective);
}

StepStats Pipeline::forward_backward(const nn::Batch& batch, const nn::Objective& objective) {
  const Tensor& x = batch.inputs;
  if (x.size(0) < options_.micro_batches) {
    throw std::invalid_argument("pipeline: a batch of " + std::to_string(x.size(0)) +
                                " rows cannot be split into " +
                                std::to_string(options_.micro_batches) + " micro-batches");
  }
  if (failed_) {
    throw std::logic_error("pipeline: a previous step failed; the pipeline cannot be reused");
  }
  const int k = options_.stages;
  std::vector<Stage::Result> results(static_cast<std::size_t>(k));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(k));
  std::atomic<bool> abort{false};
  auto run_stage = [&](int d) {
    try {
      results[static_cast<std::size_t>(d)] =
          stages_[static_cast<std::size_t>(d)]->run(batch, objective, abort);
    } catch (...) {
      errors[static_cast<std::size_t>(d)] = std::current_exception();
      abort = true;
    }
  };
  const Clock::time_point t0 = Clock::now();
  run_on_stages(run_stage);
  const Clock::time_point t1 = Clock::now();
  // The stage that failed first explains it; the others only stopped because of it.
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const comm::CommError&) {
      continue;
    } catch (...) {
      failed_ = true;
      throw;
    }
  }
  for (const auto& e : errors) {
    if (e) {
      failed_ = true;
      std::rethrow_exception(e);
    }
  }

  StepStats st;
  st.rows = x.size(0);
  st.wall_s = seconds(t0, t1);
  std::vector<std::pair<double, int>> fwd(static_cast<std::size_t>(schedule_.chunks())),
      bwd(static_cast<std::size_t>(schedule_.chunks()));
  st.chunk_costs.resize(static_cast<std::size_t>(schedule_.chunks()));
  double busy = 0;
  int owned = 0;
  for (int d = 0; d < k; ++d) {
    if (!owns(d)) {
      st.busy_s.push_back(0);
      st.peak_bytes.push_back(0);
      continue;
    }
    const Stage::Result& r = results[static_cast<std::size_t>(d)];
    st.metrics.merge(r.metrics);
    st.finite = st.finite && r.finite;
    st.busy_s.push_back(r.busy_s);
    st.peak_bytes.push_back(r.peak_bytes);
    busy += r.busy_s;
    ++owned;
    for (const auto& [c, sc] : r.forward_s) {
      auto& cost = st.chunk_costs[static_cast<std::size_t>(c)];
      cost.forward_s = sc.first / sc.second;
      cost.resident_bytes = 2 * state_bytes(*chunks_[static_cast<std::size_t>(c)]);
      cost.activation_bytes = r.activation_bytes.at(c);
    }
    for (const auto& [c, sc] : r.backward_s) {
      st.chunk_costs[static_cast<std::size_t>(c)].backward_s = sc.first / sc.second;
    }
    // A chunk's backward_s is its whole backward: B and W together.
    for (const auto& [c, sc] : r.weight_s) {
      auto& cost = st.chunk_costs[static_cast<std::size_t>(c)];
      cost.weight_s = sc.first / sc.second;
      cost.backward_s += cost.weight_s;
    }
  }
  st.bubble = st.wall_s > 0 ? 1.0 - busy / (owned * st.wall_s) : 0.0;
  for (const auto& e : st.metrics.entries())
    if (e.name == "loss") st.loss_sum = e.sum;
  return st;
}

}  // namespace hpm::pipeline
