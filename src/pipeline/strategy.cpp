#include "hpm/pipeline/strategy.h"

#include <cmath>
#include <stdexcept>

#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm::pipeline {

namespace {

void collect_batch_norms(nn::Module& m, std::vector<nn::BatchNorm*>& out) {
  if (auto* bn = dynamic_cast<nn::BatchNorm*>(&m)) out.push_back(bn);
  for (const auto& [name, child] : m.children()) collect_batch_norms(*child, out);
}

dist::StrategyOptions one_replica(dist::StrategyOptions o) {
  o.replicas = 1;
  return o;
}

class PipelineStrategy final : public dist::Strategy {
 public:
  explicit PipelineStrategy(const PipelineStrategyOptions& o)
      : Strategy(one_replica({}), 0, 1), options_(o) {}

  std::string name() const override { return "pipeline"; }

  void scope(const dist::ModelFactory& model_fn,
             const dist::OptimizerFactory& optimizer_fn) override {
    replicas_.clear();
    pipeline_.reset();
    Replica rep;
    rep.model = model_fn();
    sequential_ = std::dynamic_pointer_cast<nn::Sequential>(rep.model);
    if (!sequential_) {
      throw std::invalid_argument("the pipeline strategy needs a Sequential model, got " +
                                  rep.model->type_name());
    }
    rep.optimizer = optimizer_fn(*rep.model);
    replicas_.push_back(std::move(rep));
  }

  dist::StepResult train_step(const Tensor& x, const Tensor& y, const dist::LossFn& loss,
                              float clip, bool stop_requested) override {
    if (replicas_.empty()) throw std::logic_error("train_step before strategy.scope");
    if (!pipeline_) build(x);
    Replica& rep = replicas_[0];
    rep.optimizer->zero_grad();
    report_.last_step = pipeline_->forward_backward(x, y, loss);
    // Running statistics as one forward over the mini-batch would leave them.
    for (nn::BatchNorm* bn : batch_norms_) bn->commit_deferred();
    const StepStats& st = report_.last_step;
    dist::StepResult r;
    r.samples = st.rows;
    r.correct = st.correct;
    r.loss = st.rows > 0 ? st.loss_sum / static_cast<double>(st.rows) : 0.0;
    r.finite = st.finite && std::isfinite(r.loss);
    r.stop_requested = stop_requested;
    if (!r.finite) return r;
    if (clip > 0) optim::clip_grad_norm(rep.model->parameters(), clip);
    rep.optimizer->step();
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
        for (auto& [name, t] : sequential_->named_buffers()) {
          for (const auto& [sname, value] : saved) {
            if (sname == name) t.copy_(value);
          }
        }
        const std::size_t limit = po.device_budget == Device::kUnlimited ? 0 : po.device_budget;
        const int in_flight = po.schedule == ScheduleKind::kGPipe ? po.micro_batches : po.stages;
        report_.partition = partition(report_.layers, chunks, options_.partition, limit, in_flight);
        boundaries = report_.partition.boundaries;
      }
    }
    if (report_.partition.boundaries.empty()) report_.partition.boundaries = boundaries;
    pipeline_ = std::make_unique<Pipeline>(cut(*sequential_, boundaries), po);
    batch_norms_.clear();
    collect_batch_norms(*sequential_, batch_norms_);
    for (nn::BatchNorm* bn : batch_norms_) bn->defer_running_stats(true);
  }

  PipelineStrategyOptions options_;
  std::shared_ptr<nn::Sequential> sequential_;
  std::unique_ptr<Pipeline> pipeline_;
  PipelineReport report_;
  std::vector<nn::BatchNorm*> batch_norms_;  // deferred: committed once per mini-batch
};

}  // namespace

std::shared_ptr<dist::Strategy> make_pipeline(const PipelineStrategyOptions& options) {
  return std::make_shared<PipelineStrategy>(options);
}

const PipelineReport* pipeline_report(const dist::Strategy& strategy) {
  const auto* p = dynamic_cast<const PipelineStrategy*>(&strategy);
  return p ? p->report() : nullptr;
}

}  // namespace hpm::pipeline
