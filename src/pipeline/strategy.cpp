#include "hpm/pipeline/strategy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "hpm/nn/layers.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::pipeline {

namespace {

void collect_batch_norms(nn::Module& m, std::vector<nn::BatchNorm*>& out) {
  if (auto* bn = dynamic_cast<nn::BatchNorm*>(&m)) out.push_back(bn);
  for (const auto& [name, child] : m.children()) collect_batch_norms(*child, out);
}

distribute::StrategyOptions one_replica(distribute::StrategyOptions o) {
  o.replicas = 1;
  return o;
}

class PipelineStrategy final : public distribute::Strategy {
 public:
  PipelineStrategy(const PipelineStrategyOptions& o, comm::CommunicatorPtr workers)
      : Strategy(one_replica({}), workers ? workers->rank() : 0, workers ? workers->size() : 1),
        options_(o),
        workers_(std::move(workers)) {
    if (workers_ && workers_->size() != o.pipeline.stages) {
      throw std::invalid_argument("pipeline: " + std::to_string(o.pipeline.stages) +
                                  " stages need as many processes, there are " +
                                  std::to_string(workers_->size()));
    }
  }

  std::string name() const override { return "pipeline"; }

  void scope(const distribute::ModelFactory& model_fn,
             const distribute::OptimizerFactory& optimizer_fn) override {
    replicas_.clear();
    pipeline_.reset();
    Replica rep;
    rep.model = model_fn();
    // Any model that presents itself as blocks (GPT, ResNet, a Sequential): the stages cut it
    // between blocks and share its modules, so the model keeps its parameter names.
    sequential_ = nn::as_sequential(rep.model);
    rep.optimizer = optimizer_fn(*rep.model);
    replicas_.push_back(std::move(rep));
  }

  using distribute::Strategy::train_step;
  distribute::StepResult train_step(const nn::Batch& batch, const nn::Objective& objective,
                                    float clip, bool stop_requested) override {
    const Tensor& x = batch.inputs;
    if (replicas_.empty()) throw std::logic_error("train_step before strategy.scope");
    if (accumulation_steps() != 1) {
      throw std::invalid_argument(
          "the pipeline strategy splits each batch into its micro-batches already; gradient "
          "accumulation steps must be 1, got " +
          std::to_string(accumulation_steps()));
    }
    if (!pipeline_) build(x);
    pipeline_->set_precision(precision());
    Replica& rep = replicas_[0];
    rep.optimizer->zero_grad();
    report_.last_step = pipeline_->forward_backward(batch, objective);
    // Running statistics as one forward over the mini-batch would leave them.
    for (nn::BatchNorm* bn : batch_norms_) bn->commit_deferred();
    const StepStats& st = report_.last_step;
    // Across processes the metrics live on the last stage, and any stage may have seen a NaN or
    // a stop request: every process learns all of it (in the objective's order of metrics, which
    // the stages without outputs contribute zeros to).
    distribute::StepResult r;
    r.metrics = nn::Metrics(objective.metric_names(batch));
    r.metrics.merge(st.metrics);
    std::vector<double> flags = {st.finite ? 0.0 : 1.0, stop_requested ? 1.0 : 0.0};
    distribute::all_reduce_metrics(r.metrics, flags, workers_.get());
    r.samples = st.rows;
    distribute::set_from_metrics(r);
    r.finite = flags[0] == 0 && std::isfinite(r.loss);
    r.stop_requested = flags[1] > 0;
    if (!r.finite) return r;
    sum_tied_gradients();
    if (clip > 0 && !clip_gradients(clip)) {
      rep.optimizer->halt_updates();  // the Trainer reads it after this step and stops
      return r;
    }
    if (workers_) {
      // Each process updates what it computed (its stage, and tied weights it holds); the other
      // stages' new values reach it in synchronize(), when something reads the whole model.
      rep.optimizer->step();
      stale_ = true;
    } else {
      // Each stage updates its own parameters on its own thread, as the stages computed them:
      // the update is a pass over every weight, its gradient and the optimizer's state, which
      // one thread would otherwise make while the other stages' cores sit idle.
      rep.optimizer->begin_step();
      pipeline_->on_stages(
          [&](int d) { rep.optimizer->step_params(stage_params_[static_cast<std::size_t>(d)]); });
      rep.optimizer->step_params(unplaced_params_);
    }
    return r;
  }

  const PipelineReport* report() const { return pipeline_ ? &report_ : nullptr; }

 private:
  // Cuts the model and starts the stages. Profiling runs the layers on a sample; it must leave
  // no trace in what training computes (BatchNorm statistics, random numbers, gradients).
  void build(const Tensor& x) {
    const PipelineOptions& po = options_.pipeline;
    const int chunks = po.stages * po.chunks_per_stage;
    std::vector<int> boundaries = options_.boundaries;
    report_ = PipelineReport{};
    if (boundaries.empty()) {
      if (options_.partition == PartitionMethod::kUniform) {
        for (int k = 0; k <= chunks; ++k) {
          boundaries.push_back(k * static_cast<int>(sequential_->size()) / chunks);
        }
      } else {
        const std::int64_t rows = (x.size(0) + po.micro_batches - 1) / po.micro_batches;
        nn::NamedTensors saved;
        for (const auto& [name, t] : sequential_->named_buffers())
          saved.emplace_back(name, t.clone());
        const Generator::State rng = default_generator().state();
        report_.layers = profile_layers(*sequential_, x.narrow(0, rows), options_.profile_repeats);
        default_generator().set_state(rng);
        const nn::NamedTensors buffers = sequential_->named_buffers();
        for (std::size_t i = 0; i < buffers.size(); ++i) {
          Tensor t = buffers[i].second;
          t.copy_(saved[i].second);
        }
        const std::size_t limit = po.device_budget == Device::kUnlimited ? 0 : po.device_budget;
        const int in_flight =
            po.schedule == ScheduleKind::kGPipe ? po.micro_batches : po.stages;  // 1F1B, ZB-H1
        report_.partition = partition(report_.layers, chunks, options_.partition, limit, in_flight);
        boundaries = report_.partition.boundaries;
      }
    }
    if (workers_) {
      // Each process profiled its own copy; rank 0's cut is the one all of them use.
      Tensor b = Tensor::from_i64(std::vector<std::int64_t>(boundaries.begin(), boundaries.end()),
                                  {chunks + 1});
      workers_->broadcast(b, 0)->wait();
      const std::vector<std::int64_t> cut = b.to_vector_i64();
      for (int k = 0; k <= chunks; ++k) {
        boundaries[static_cast<std::size_t>(k)] =
            static_cast<int>(cut[static_cast<std::size_t>(k)]);
      }
      report_.partition.boundaries = boundaries;
    }
    if (report_.partition.boundaries.empty()) report_.partition.boundaries = boundaries;
    chunks_ = cut(*sequential_, boundaries);
    find_ties(po);
    pipeline_ = workers_ ? std::make_unique<Pipeline>(chunks_, po, workers_)
                         : std::make_unique<Pipeline>(chunks_, po);
    place_parameters();
    batch_norms_.clear();
    collect_batch_norms(*sequential_, batch_norms_);
    for (nn::BatchNorm* bn : batch_norms_) bn->defer_running_stats(true);
  }

  // A parameter used by chunks on two stages (a tied weight: GPT's token embedding and its head)
  // gets a partial gradient on each, as Megatron's copies of the embedding do. On threads the
  // stages share the one tensor and add into its gradient under a lock (the values need no
  // synchronizing); across processes each holds a copy, and their gradients are summed before
  // clipping and the update (sum_tied_gradients), which every holder then applies alike.
  struct Tie {
    Tensor tensor;
    std::vector<int> stages;  // ascending: the stages whose chunks use it
  };
  void find_ties(const PipelineOptions& po) {
    ties_.clear();
    std::map<const TensorImpl*, std::size_t> index;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const int stage = static_cast<int>(c) % po.stages;
      for (const Tensor& p : chunks_[c]->parameters()) {
        const auto [it, fresh] = index.try_emplace(p.impl(), ties_.size());
        if (fresh) ties_.push_back({p, {}});
        auto& stages = ties_[it->second].stages;
        if (std::find(stages.begin(), stages.end(), stage) == stages.end()) stages.push_back(stage);
      }
    }
    std::erase_if(ties_, [](const Tie& t) { return t.stages.size() < 2; });
    for (Tie& t : ties_) {
      std::sort(t.stages.begin(), t.stages.end());
      if (!workers_) t.tensor.autograd_meta().accumulate_lock = std::make_shared<std::mutex>();
    }
  }

  bool uses(const Tie& t, int stage) const {
    return std::find(t.stages.begin(), t.stages.end(), stage) != t.stages.end();
  }

  // Across processes: every stage that uses a tied weight gets the sum of all their gradients
  // (one all-reduce for all ties; a stage that does not use one adds zeros).
  void sum_tied_gradients() {
    if (!workers_ || ties_.empty()) return;
    const int me = workers_->rank();
    std::int64_t n = 0;
    for (const Tie& t : ties_) n += t.tensor.numel();
    Tensor flat = Tensor::zeros({n});
    std::int64_t at = 0;
    for (const Tie& t : ties_) {
      const Tensor g = t.tensor.grad();
      if (g.defined()) flat.narrow(at, g.numel()).copy_(g);
      at += t.tensor.numel();
    }
    workers_->allreduce(flat, comm::ReduceOp::kSum)->wait();
    at = 0;
    for (Tie& t : ties_) {
      if (uses(t, me)) {
        Tensor g = t.tensor.grad();
        if (!g.defined()) {
          g = Tensor::empty(t.tensor.shape());
          t.tensor.set_grad(g);
        }
        g.copy_(flat.narrow(at, g.numel()));
      }
      at += t.tensor.numel();
    }
  }

  // Whether this process counts `p`'s gradient in the global norm: a tied weight's summed
  // gradient is on every stage that uses it, and only the first of them counts it.
  bool counts_in_norm(const Tensor& p) const {
    for (const Tie& t : ties_) {
      if (t.tensor.impl() == p.impl()) return t.stages.front() == workers_->rank();
    }
    return true;
  }

  // Which of the optimizer's parameters each stage updates: those of its chunks.
  void place_parameters() {
    std::map<const TensorImpl*, int> stage_of;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      for (const Tensor& p : chunks_[c]->parameters()) {
        stage_of[p.impl()] = pipeline_->schedule().device_of(static_cast<int>(c));
      }
    }
    stage_params_.assign(static_cast<std::size_t>(options_.pipeline.stages), {});
    unplaced_params_.clear();
    const nn::NamedTensors& params = replicas_[0].optimizer->params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto it = stage_of.find(params[i].second.impl());
      if (it == stage_of.end()) {
        unplaced_params_.push_back(i);
      } else {
        stage_params_[static_cast<std::size_t>(it->second)].push_back(i);
      }
    }
  }

  // By the global norm over every stage's gradients (each process holds only its own), as
  // clip_grad_norm scales them. False, scaling nothing, when that norm is not finite
  // (Optimizer::clip_and_step's verdict).
  bool clip_gradients(float max_norm) {
    Replica& rep = replicas_[0];
    std::vector<Tensor> grads;
    for (const Tensor& p : rep.model->parameters()) {
      if (p.grad().defined() && (!workers_ || counts_in_norm(p))) grads.push_back(p.grad());
    }
    double norm_sq = kernels::squared_norm(grads).item<double>();
    if (workers_) {
      Tensor t = Tensor::from({static_cast<float>(norm_sq)}, {1});
      workers_->allreduce(t, comm::ReduceOp::kSum)->wait();
      norm_sq = t.item();
    }
    if (!std::isfinite(norm_sq)) return false;
    optim::clip_grads_to(rep.model->parameters(), norm_sq, max_norm);
    return true;
  }

  // Every process gets every stage's new values, so that any of them can evaluate, checkpoint
  // or back up the whole model, as with the other strategies: the weights and buffers of the
  // stage's chunks and the optimizer's state of its parameters, in one broadcast of bytes per
  // stage from the process that updated it (integer buffers, BatchNorm's batch count, as they are).
  void synchronize() override {
    if (!workers_ || !stale_) return;
    stale_ = false;
    optim::Optimizer& opt = *replicas_[0].optimizer;
    const nn::NamedTensors& params = opt.params();
    for (int d = 0; d < workers_->size(); ++d) {
      std::vector<Tensor> state;
      for (std::size_t c = 0; c < chunks_.size(); ++c) {
        if (pipeline_->schedule().device_of(static_cast<int>(c)) != d) continue;
        for (const auto& [name, t] : chunks_[c]->state_dict()) {
          if (t.dtype() == DType::F32 || t.dtype() == DType::I64) state.push_back(t);
        }
      }
      // The optimizer's buffers, each behind a flag byte: whether the owner has it yet (a
      // parameter that never had a gradient has none, and must not get zeros that change its
      // first update).
      std::vector<std::pair<std::size_t, std::string>> buffers;
      for (std::size_t i : stage_params_[static_cast<std::size_t>(d)]) {
        for (const std::string& b : opt.buffer_names(i)) buffers.emplace_back(i, b);
      }
      std::int64_t n = static_cast<std::int64_t>(buffers.size());
      for (const Tensor& t : state) n += static_cast<std::int64_t>(t.nbytes());
      for (const auto& b : buffers) {
        n += params[b.first].second.numel() * static_cast<std::int64_t>(sizeof(float));
      }
      Tensor flat = Tensor::zeros({std::max<std::int64_t>(n, 1)}, DType::U8);
      std::int64_t at = 0;
      // The next `bytes` of the message.
      const auto next = [&](std::int64_t bytes) {
        Tensor part = flat.narrow(at, bytes);
        at += bytes;
        return part;
      };
      const bool mine = d == workers_->rank();
      if (mine) {
        for (const Tensor& t : state)
          next(static_cast<std::int64_t>(t.nbytes())).copy_(t.bytes_view());
        for (const auto& [i, name] : buffers) {
          const Tensor buf = opt.find_buffer(i, name);
          next(1).fill_(buf.defined() ? 1.0f : 0.0f);
          Tensor room = next(params[i].second.numel() * static_cast<std::int64_t>(sizeof(float)));
          if (buf.defined()) room.copy_(buf.bytes_view());
        }
      }
      workers_->broadcast(flat, d)->wait();
      if (mine) continue;
      at = 0;
      for (Tensor& t : state) t.bytes_view().copy_(next(static_cast<std::int64_t>(t.nbytes())));
      for (const auto& [i, name] : buffers) {
        const bool present = next(1).to_bytes()[0] != 0;
        const Tensor room =
            next(params[i].second.numel() * static_cast<std::int64_t>(sizeof(float)));
        if (present) opt.make_buffer(i, name).bytes_view().copy_(room);
      }
    }
  }

  PipelineStrategyOptions options_;
  comm::CommunicatorPtr workers_;
  std::vector<std::shared_ptr<nn::Module>> chunks_;
  std::shared_ptr<nn::Sequential> sequential_;
  std::unique_ptr<Pipeline> pipeline_;
  PipelineReport report_;
  std::vector<nn::BatchNorm*> batch_norms_;             // deferred: committed once per mini-batch
  std::vector<std::vector<std::size_t>> stage_params_;  // optimizer indices, per stage
  std::vector<std::size_t> unplaced_params_;  // in no chunk: updated by the calling thread
  std::vector<Tie> ties_;                     // parameters used on more than one stage
  bool stale_ = false;  // across processes: other stages were updated since synchronize()
};

}  // namespace

std::shared_ptr<distribute::Strategy> make_pipeline(const PipelineStrategyOptions& options,
                                                    comm::CommunicatorPtr workers) {
  return std::make_shared<PipelineStrategy>(options, std::move(workers));
}

const PipelineReport* pipeline_report(const distribute::Strategy& strategy) {
  const auto* p = dynamic_cast<const PipelineStrategy*>(&strategy);
  return p ? p->report() : nullptr;
}

}  // namespace hpm::pipeline
