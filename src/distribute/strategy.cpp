#include "hpm/distribute/strategy.h"

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "hpm/autograd/grad_mode.h"
#include "hpm/comm/hierarchical.h"
#include "hpm/comm/local.h"
#include "hpm/nn/losses.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/trace/trace.h"

namespace hpm::distribute {

// ---------------------------------------------------------------------------------------------
// Pool: one long-lived thread per local replica, each with its own intra-op thread count (an
// OpenMP setting is per thread), started together for each step.

class Strategy::Pool {
 public:
  Pool(int replicas, int threads_each) {
    for (int r = 0; r < replicas; ++r) {
      threads_.emplace_back([this, r, threads_each] {
        set_num_threads(threads_each);
        trace::name_thread("replica " + std::to_string(r));
        loop(r);
      });
    }
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // Runs fn(r) on replica r's thread for every r; rethrows the first replica's exception.
  void run(const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &fn;
    remaining_ = static_cast<int>(threads_.size());
    errors_.assign(threads_.size(), nullptr);
    ++generation_;
    cv_.notify_all();
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
    job_ = nullptr;
    for (auto& e : errors_)
      if (e) std::rethrow_exception(e);
  }

 private:
  void loop(int r) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        job = job_;
      }
      std::exception_ptr error;
      try {
        (*job)(r);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      errors_[static_cast<std::size_t>(r)] = error;
      if (--remaining_ == 0) done_cv_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  int remaining_ = 0;
  std::vector<std::exception_ptr> errors_;
  bool stopping_ = false;
};

// ---------------------------------------------------------------------------------------------

namespace {

void copy_state(const nn::Module& from, const nn::Module& to) {
  const nn::NamedTensors src = from.state_dict();
  nn::NamedTensors dst = to.state_dict();
  for (std::size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
}

// Buffers only (BatchNorm's running statistics), in the order both modules list them.
void copy_buffers(const nn::Module& from, const nn::Module& to) {
  const nn::NamedTensors src = from.named_buffers();
  nn::NamedTensors dst = to.named_buffers();
  for (std::size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
}

std::uint64_t replica_seed(std::uint64_t seed, int replica) {
  return seed + 1000003ull * static_cast<std::uint64_t>(replica + 1);
}

}  // namespace

Strategy::Strategy(const StrategyOptions& options, int worker_rank, int num_workers)
    : options_(options), worker_rank_(worker_rank), num_workers_(num_workers) {
  if (options.replicas < 1) throw std::invalid_argument("a strategy needs at least one replica");
  micro_batches(0, options.accumulation_steps);  // validates it
}

Strategy::~Strategy() = default;

void Strategy::scope(const ModelFactory& model_fn, const OptimizerFactory& optimizer_fn) {
  replicas_.clear();
  Generator::State after_first{};
  for (int r = 0; r < options_.replicas; ++r) {
    Replica rep;
    rep.model = model_fn();
    rep.optimizer = optimizer_fn(*rep.model);
    rep.generator = std::make_unique<Generator>(
        replica_seed(options_.seed, worker_rank_ * options_.replicas + r));
    if (r == 0) after_first = default_generator().state();
    replicas_.push_back(std::move(rep));
  }
  // Replicas beyond the first are overwritten with its values: the generator continues as if they
  // had never been drawn, so a strategy changes no later random number.
  default_generator().set_state(after_first);
  for (std::size_t r = 1; r < replicas_.size(); ++r)
    copy_state(*replicas_[0].model, *replicas_[r].model);
  const int per = std::max(1, options_.threads / options_.replicas);
  pool_ = std::make_unique<Pool>(options_.replicas, per);
  // The replicas own the CPU budget now. The calling thread only feeds them; a kernel team of its
  // own would spin between its parallel regions (OpenMP's active wait) on the replicas' cores.
  if (options_.replicas > 1) set_num_threads(1);
}

std::shared_ptr<nn::Module> Strategy::model() const { return replicas_.at(0).model; }
std::shared_ptr<optim::Optimizer> Strategy::optimizer() const { return replicas_.at(0).optimizer; }

void Strategy::mirror_from_primary() {
  const nn::NamedTensors state = replicas_.at(0).optimizer->state();
  for (std::size_t r = 1; r < replicas_.size(); ++r) {
    copy_state(*replicas_[0].model, *replicas_[r].model);
    replicas_[r].optimizer->load_state(state);
  }
}

std::vector<Generator::State> Strategy::replica_generator_states() {
  std::vector<Generator::State> local;
  for (const Replica& rep : replicas_) {
    if (!rep.generator) return {};  // the caller's default generator: saved on its own
    local.push_back(rep.generator->state());
  }
  comm::Communicator* workers = worker_communicator();
  if (workers == nullptr || workers->size() == 1) return local;
  // Every worker's, in rank order (each holds replicas_ of the same count): fixed-size records.
  constexpr std::size_t kRecord = 4 * 8 + 1 + 4;
  std::string mine;
  for (const Generator::State& st : local) {
    for (std::uint64_t w : st.s) mine.append(reinterpret_cast<const char*>(&w), 8);
    mine.push_back(st.has_spare ? 1 : 0);
    mine.append(reinterpret_cast<const char*>(&st.spare), 4);
  }
  Tensor in = Tensor::from_bytes(mine, Device::cpu());
  Tensor out = Tensor::empty({static_cast<std::int64_t>(mine.size()) * workers->size()}, DType::U8,
                             Device::cpu());
  workers->allgather(in, out)->wait();
  const std::string all = out.to_bytes();
  std::vector<Generator::State> states(all.size() / kRecord);
  for (std::size_t i = 0; i < states.size(); ++i) {
    const char* p = all.data() + i * kRecord;
    for (std::size_t k = 0; k < 4; ++k) std::memcpy(&states[i].s[k], p + 8 * k, 8);
    states[i].has_spare = p[32] != 0;
    std::memcpy(&states[i].spare, p + 33, 4);
  }
  return states;
}

bool Strategy::set_replica_generator_states(const std::vector<Generator::State>& states) {
  if (static_cast<int>(states.size()) != num_replicas_in_sync()) return false;
  for (const Replica& rep : replicas_)
    if (!rep.generator) return false;
  for (std::size_t r = 0; r < replicas_.size(); ++r) {
    replicas_[r].generator->set_state(
        states[static_cast<std::size_t>(worker_rank_ * local_replicas()) + r]);
  }
  return true;
}

void Strategy::set_lr(float lr) {
  for (auto& rep : replicas_) rep.optimizer->set_lr(lr);
}

void Strategy::run(const std::function<void(ReplicaContext&)>& fn) {
  if (replicas_.empty())
    throw std::logic_error("strategy.run before strategy.scope built the replicas");
  const auto all_reduce_for = [this](int r) {
    return [this, r](Tensor& values, comm::ReduceOp op) {
      comm::Communicator* c = replica_communicator(r);
      if (c != nullptr && c->size() > 1) c->allreduce(values, op)->wait();
    };
  };
  if (!pool_) {  // one replica on the caller's thread
    ReplicaContext ctx{worker_rank_, num_replicas_in_sync(), *replicas_[0].model,
                       *replicas_[0].optimizer, all_reduce_for(0)};
    fn(ctx);
    return;
  }
  pool_->run([&](int r) {
    Replica& rep = replicas_[static_cast<std::size_t>(r)];
    ThreadGeneratorGuard gen(*rep.generator);
    ReplicaContext ctx{worker_rank_ * local_replicas() + r, num_replicas_in_sync(), *rep.model,
                       *rep.optimizer, all_reduce_for(r)};
    fn(ctx);
  });
}

StepResult Strategy::train_step(const Tensor& x, const Tensor& y, const LossFn& loss,
                                float clip_grad_norm, bool stop_requested) {
  const nn::FunctionObjective objective(
      [&loss](const Tensor& outputs, const Tensor&, const Tensor& targets) {
        return loss(outputs, targets);
      },
      "loss");
  return train_step(nn::Batch{x, y}, objective, clip_grad_norm, stop_requested);
}

std::pair<std::int64_t, std::int64_t> Strategy::replica_rows(std::int64_t batch, int r) const {
  // The batch is split among the replicas it belongs to: this worker's, or everybody's.
  const bool own = options_.per_worker_batches;
  const std::int64_t n = own ? local_replicas() : num_replicas_in_sync();
  const std::int64_t i = (own ? 0 : static_cast<std::int64_t>(worker_rank_) * local_replicas()) + r;
  const std::int64_t first = batch * i / n, last = batch * (i + 1) / n;
  return {first, last - first};
}

ReplicaStepResult Strategy::forward_backward(int r, const nn::Batch& batch,
                                             const nn::Objective& objective, Reducer* reducer,
                                             const std::function<void(bool)>& on_loss) {
  Replica& rep = replicas_[static_cast<std::size_t>(r)];
  const auto [first, rows] = replica_rows(batch.rows(), r);
  rep.optimizer->zero_grad();
  ReplicaStepOptions o;
  o.micro_batches = options_.accumulation_steps;
  o.replicas_in_sync = num_replicas_in_sync();
  // The global batch's weight: every worker's share of it is this batch, or (per-worker input)
  // one of num_workers equal ones.
  o.step_weight = objective.weight(batch) * (options_.per_worker_batches ? num_workers_ : 1);
  o.reducer = reducer;
  o.on_loss = on_loss;
  o.precision = options_.precision;
  return replica_step(*rep.model, objective, batch.slice(first, rows), o);
}

void Strategy::set_accumulation_steps(int k) {
  micro_batches(0, k);  // validates k
  options_.accumulation_steps = k;
}

StepResult Strategy::combine(const std::vector<ReplicaStepResult>& outcomes,
                             const nn::Objective& objective, const nn::Batch& batch,
                             comm::Communicator* workers, bool stop_requested) {
  StepResult r;
  r.metrics = nn::Metrics(objective.metric_names(batch));
  double rows = 0, bad = 0, stop = stop_requested ? 1 : 0;
  for (const auto& o : outcomes) {
    r.metrics.merge(o.metrics);
    rows += static_cast<double>(o.rows);
    bad += o.finite ? 0 : 1;
  }
  std::vector<double> counters = {rows, bad, stop};
  all_reduce_metrics(r.metrics, counters, workers);
  r.samples = static_cast<std::int64_t>(counters[0]);
  set_from_metrics(r);
  r.finite = counters[1] == 0 && std::isfinite(r.loss);
  r.stop_requested = counters[2] > 0;
  return r;
}

void all_reduce_metrics(nn::Metrics& metrics, std::vector<double>& counters,
                        comm::Communicator* workers) {
  if (workers == nullptr || workers->size() <= 1) return;
  std::vector<float> v;
  for (const auto& e : metrics.entries()) {
    v.push_back(static_cast<float>(e.sum));
    v.push_back(static_cast<float>(e.count));
  }
  for (double c : counters) v.push_back(static_cast<float>(c));
  Tensor t = Tensor::from(v, {static_cast<std::int64_t>(v.size())});
  workers->allreduce(t, comm::ReduceOp::kSum)->wait();
  const std::vector<float> p = t.to_vector();
  std::size_t i = 0;
  for (auto& e : metrics.entries()) {
    e.sum = p[i++];
    e.count = p[i++];
  }
  for (double& c : counters) c = p[i++];
}

void set_from_metrics(StepResult& result) {
  result.loss = result.metrics.mean("loss");
  result.correct = std::llround(result.metrics.sum("accuracy"));
}

double Strategy::reduce(comm::ReduceOp op, const std::vector<double>& per_replica) {
  const bool max = op == comm::ReduceOp::kMax;
  double v = max ? -INFINITY : 0.0;
  for (double x : per_replica) v = max ? std::max(v, x) : v + x;
  if (comm::Communicator* workers = worker_communicator();
      workers != nullptr && workers->size() > 1) {
    Tensor t = Tensor::from({static_cast<float>(v)}, {1});
    workers->allreduce(t, max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum)->wait();
    v = t.item();
  }
  if (op == comm::ReduceOp::kAverage) v /= static_cast<double>(num_replicas_in_sync());
  return v;
}

// ---------------------------------------------------------------------------------------------
// OneDevice

namespace {

class OneDevice final : public Strategy {
 public:
  explicit OneDevice(const StrategyOptions& o) : Strategy(with_one_replica(o), 0, 1) {}
  std::string name() const override { return "one_device"; }

  void scope(const ModelFactory& model_fn, const OptimizerFactory& optimizer_fn) override {
    replicas_.clear();
    Replica rep;
    rep.model = model_fn();
    rep.optimizer = optimizer_fn(*rep.model);
    replicas_.push_back(std::move(rep));
  }

  // On the caller's thread with the default generator: exactly the single-device training loop.
  using Strategy::train_step;
  StepResult train_step(const nn::Batch& batch, const nn::Objective& objective, float clip,
                        bool stop_requested) override {
    ReplicaStepResult o = forward_backward(0, batch, objective, nullptr);
    StepResult r = combine({o}, objective, batch, nullptr, stop_requested);
    if (!r.finite) return r;
    replicas_[0].optimizer->clip_and_step(clip);
    return r;
  }

 private:
  static StrategyOptions with_one_replica(StrategyOptions o) {
    o.replicas = 1;
    return o;
  }
};

// Mirrored and MultiWorkerMirrored: the same step, over communicators of different reach.
class MirroredBase : public Strategy {
 public:
  MirroredBase(const StrategyOptions& o, int worker_rank, int num_workers,
               comm::CommunicatorPtr workers)
      : Strategy(o, worker_rank, num_workers), workers_(std::move(workers)) {}

  void scope(const ModelFactory& model_fn, const OptimizerFactory& optimizer_fn) override {
    Strategy::scope(model_fn, optimizer_fn);
    std::vector<comm::CommunicatorPtr> comms = make_replica_communicators();
    reducers_.clear();
    reducers_.resize(replicas_.size());
    // Reducers verify the model and broadcast its values: a collective, so every replica at once.
    run([&](ReplicaContext& c) {
      const int r = c.replica_id_in_sync - worker_rank_ * local_replicas();
      comms[static_cast<std::size_t>(r)]->set_algorithm(options_.algorithm);
      reducers_[static_cast<std::size_t>(r)] =
          std::make_unique<Reducer>(c.model, comms[static_cast<std::size_t>(r)], options_.reducer);
    });
  }

  void mirror_from_primary() override {
    Strategy::mirror_from_primary();
    if (workers_ && workers_->size() > 1) {  // every worker restored the same checkpoint; make sure
      run([&](ReplicaContext& c) {
        broadcast_state(c.model,
                        *reducers_[static_cast<std::size_t>(c.replica_id_in_sync -
                                                            worker_rank_ * local_replicas())]
                             ->communicator());
      });
    }
  }

  // The replicas' running statistics, each from its own rows, become their mean on every replica:
  // what every worker then evaluates and saves is one model.
  void synchronize() override {
    if (reducers_.empty() || reducers_.front()->communicator()->size() == 1) return;
    run([&](ReplicaContext& c) {
      average_buffers(c.model, *reducers_[static_cast<std::size_t>(c.replica_id_in_sync -
                                                                   worker_rank_ * local_replicas())]
                                    ->communicator());
    });
  }

  using Strategy::train_step;
  StepResult train_step(const nn::Batch& batch, const nn::Objective& objective, float clip,
                        bool stop_requested) override {
    std::vector<ReplicaStepResult> outcomes(replicas_.size());
    // In one process, every replica can see whether any loss was not finite once its gradients
    // are reduced (each replica marks the flag before it joins the all-reduce that finalize waits
    // for), so forward, backward and update are one job per step. Across processes the verdict
    // takes a collective of its own, so the update waits for a second job.
    const bool one_process = workers_ == nullptr || workers_->size() == 1;
    std::atomic<int> not_finite{0};
    run([&](ReplicaContext& c) {
      const int r = c.replica_id_in_sync - worker_rank_ * local_replicas();
      ReplicaStepResult& o = outcomes[static_cast<std::size_t>(r)];
      o = forward_backward(r, batch, objective, reducers_[static_cast<std::size_t>(r)].get(),
                           [&](bool finite) { not_finite.fetch_add(finite ? 0 : 1); });
      if (one_process && not_finite.load() == 0) update(c, clip);
    });
    StepResult result = combine(outcomes, objective, batch, workers_.get(), stop_requested);
    if (!result.finite || one_process) return result;
    run([&](ReplicaContext& c) { update(c, clip); });
    return result;
  }

  comm::Communicator* worker_communicator() const override { return workers_.get(); }
  comm::Communicator* replica_communicator(int r) const override {
    return reducers_.empty() ? nullptr
                             : reducers_[static_cast<std::size_t>(r)]->communicator().get();
  }

  double gradient_wait_seconds() const override {
    double total = 0;
    for (const auto& r : reducers_) total += r->stats().finalize_wait_seconds;
    return reducers_.empty() ? 0.0 : total / static_cast<double>(reducers_.size());
  }

 protected:
  // Gradients are identical on every replica, so clipping and the update are too.
  static void update(ReplicaContext& c, float clip) { c.optimizer.clip_and_step(clip); }
  virtual std::vector<comm::CommunicatorPtr> make_replica_communicators() = 0;
  comm::CommunicatorPtr workers_;
  std::vector<std::unique_ptr<Reducer>> reducers_;
};

class Mirrored final : public MirroredBase {
 public:
  explicit Mirrored(const StrategyOptions& o) : MirroredBase(o, 0, 1, nullptr) {}
  std::string name() const override { return "mirrored"; }

 protected:
  std::vector<comm::CommunicatorPtr> make_replica_communicators() override {
    return comm::make_local_group(options_.replicas, options_.timeout);
  }
};

class MultiWorkerMirrored final : public MirroredBase {
 public:
  MultiWorkerMirrored(comm::CommunicatorPtr workers, const StrategyOptions& o)
      : MirroredBase(o, workers->rank(), workers->size(), workers) {}
  std::string name() const override { return "multi_worker_mirrored"; }

 protected:
  std::vector<comm::CommunicatorPtr> make_replica_communicators() override {
    if (options_.replicas == 1) return {workers_};
    return comm::make_hierarchical_group(workers_, options_.replicas, options_.timeout);
  }
};

class CentralStorage final : public Strategy {
 public:
  explicit CentralStorage(const StrategyOptions& o) : Strategy(o, 0, 1) {}
  std::string name() const override { return "central_storage"; }

  void scope(const ModelFactory& model_fn, const OptimizerFactory& optimizer_fn) override {
    central_model_ = model_fn();
    central_optimizer_ = optimizer_fn(*central_model_);
    const Generator::State after_central = default_generator().state();
    Strategy::scope(model_fn, [](nn::Module& m) {  // replicas only compute: plain SGD never steps
      return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{});
    });
    default_generator().set_state(after_central);
    for (auto& rep : replicas_) copy_state(*central_model_, *rep.model);
    // The replicas compute in one process and meet only through the central variables; a local
    // group serves ReplicaContext::all_reduce in custom loops.
    replica_comms_ = comm::make_local_group(options_.replicas, options_.timeout);
  }

  comm::Communicator* replica_communicator(int r) const override {
    return replica_comms_.empty() ? nullptr : replica_comms_[static_cast<std::size_t>(r)].get();
  }

  std::shared_ptr<nn::Module> model() const override { return central_model_; }
  std::shared_ptr<optim::Optimizer> optimizer() const override { return central_optimizer_; }
  void mirror_from_primary() override {}  // replicas read the central variables every step
  void set_lr(float lr) override { central_optimizer_->set_lr(lr); }

  using Strategy::train_step;
  StepResult train_step(const nn::Batch& batch, const nn::Objective& objective, float clip,
                        bool stop_requested) override {
    std::vector<ReplicaStepResult> outcomes(replicas_.size());
    run([&](ReplicaContext& c) {
      const int r = c.replica_id_in_sync;
      copy_state(*central_model_, c.model);  // read the variables from where they live
      outcomes[static_cast<std::size_t>(r)] = forward_backward(r, batch, objective, nullptr);
    });
    // The forwards moved the replicas' buffers (BatchNorm's running statistics), which the copy
    // above would overwrite next step: the central variables keep replica 0's, as Mirrored's
    // primary copy is replica 0. Like every strategy, before the finiteness check (a skipped
    // update still ran its forward).
    copy_buffers(*replicas_[0].model, *central_model_);
    StepResult result = combine(outcomes, objective, batch, nullptr, stop_requested);
    if (!result.finite) return result;
    aggregate_gradients();
    central_optimizer_->clip_and_step(clip);
    return result;
  }

 private:
  // central.grad = mean over replicas, added in replica order (deterministic).
  void aggregate_gradients() {
    trace::Span span("aggregate gradients", "comm");
    const std::vector<Tensor> central = central_model_->parameters();
    std::vector<std::vector<Tensor>> reps;
    for (auto& rep : replicas_) reps.push_back(rep.model->parameters());
    const float inv = 1.0f / static_cast<float>(replicas_.size());
    for (std::size_t i = 0; i < central.size(); ++i) {
      Tensor g = Tensor::zeros(central[i].shape());
      for (auto& params : reps) {
        const Tensor rg = params[i].grad();
        if (rg.defined()) kernels::axpy_(g, 1.0f, rg);
      }
      kernels::scale_(g, inv);
      Tensor p = central[i];
      p.set_grad(g);
    }
  }

  std::shared_ptr<nn::Module> central_model_;
  std::shared_ptr<optim::Optimizer> central_optimizer_;
  std::vector<comm::CommunicatorPtr> replica_comms_;
};

}  // namespace

std::shared_ptr<Strategy> make_one_device(const StrategyOptions& options) {
  return std::make_shared<OneDevice>(options);
}
std::shared_ptr<Strategy> make_mirrored(const StrategyOptions& options) {
  return std::make_shared<Mirrored>(options);
}
std::shared_ptr<Strategy> make_multi_worker_mirrored(comm::CommunicatorPtr workers,
                                                     const StrategyOptions& options) {
  if (!workers)
    throw std::invalid_argument("multi_worker_mirrored needs a process-level communicator");
  return std::make_shared<MultiWorkerMirrored>(std::move(workers), options);
}
std::shared_ptr<Strategy> make_central_storage(const StrategyOptions& options) {
  return std::make_shared<CentralStorage>(options);
}

}  // namespace hpm::distribute
