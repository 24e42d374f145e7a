// Codistillation (Anil et al. 2018, "Large scale distributed neural network training through
// online distillation"): K copies of one model train at the same time, each in its own worker
// group, on disjoint or identical shards of the data. Every N steps they exchange parameters
// (an allgather of each copy's flattened parameters through hpm::comm); after a burn-in of B
// steps each copy adds a distillation term toward its peers' predictions, computed by its stale
// copies of the peers (evaluated on its own batch, in eval mode, without gradients):
//
//   step < B:  loss = CE(logits, labels)                        (as independent training)
//   step >= B: loss = (1 - alpha) CE + alpha T^2 KL(p_peers^T || softmax(logits / T)),
//              p_peers^T = mean over peers of softmax(peer(x) / T)
//
// The peers' copies are at most N steps stale: they hold the parameters the peers had after step
// floor(step / N) * N (the first exchange happens before the first step). Everything goes through
// the Communicator interface, so the same code runs the copies as threads of one process
// (comm::make_local_group) or as processes (`hpm launch -n K`, gloo). Here one worker trains
// each copy (a worker group of one).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hpm/comm/communicator.h"
#include "hpm/distill/distiller.h"
#include "hpm/nn/module.h"
#include "hpm/tensor/tensor.h"
#include "hpm/train/trainer.h"

namespace hpm::distill {

struct CodistillOptions {
  std::int64_t exchange_every = 100;  // N >= 1: steps between parameter exchanges
  std::int64_t burn_in = 0;           // B: steps of plain cross-entropy first
  float alpha = 0.5f;                 // share of the distillation term; 0: independent training
  float temperature = 1.0f;           // T > 0
};

// One copy's side: its model, the communicator of the copies (rank = this copy) and stale copies
// of the other copies' models.
class Codistiller {
 public:
  // `make_model` builds a model of the same architecture (for the peers' copies; its initial
  // values do not matter). Throws std::invalid_argument for bad options or a null argument.
  Codistiller(comm::CommunicatorPtr comm, std::shared_ptr<nn::Module> model,
              const std::function<std::shared_ptr<nn::Module>()>& make_model,
              CodistillOptions options);

  // A collective: every copy calls it at the same steps. Allgathers the flattened parameters
  // (and float buffers) of all copies and loads the peers' into their copies. `step` = the
  // optimizer steps this copy has taken. Throws comm::CommError (naming the rank) when a peer
  // fails or is gone.
  void exchange(std::int64_t step);

  // The loss of this copy's `logits` for batch `inputs` before its step number `step` (0-based).
  Tensor loss(const Tensor& inputs, const Tensor& logits, const Tensor& labels,
              std::int64_t step) const;
  // mean over peers of softmax(peer(inputs) / T), (N, C) (a language model's: (B, T, V)), without
  // gradients. Throws std::logic_error before the first exchange.
  Tensor peer_targets(const Tensor& inputs) const;

  bool exchanges_enabled() const { return options_.alpha > 0.0f && comm_->size() > 1; }
  int rank() const { return comm_->rank(); }
  int copies() const { return comm_->size(); }
  comm::Communicator& communicator() const { return *comm_; }
  // The peers' copies, in rank order without this copy's rank.
  const std::vector<std::shared_ptr<nn::Module>>& peers() const { return peers_; }
  std::int64_t last_exchange_step() const { return last_exchange_step_; }  // -1: none yet
  std::int64_t exchanges() const { return exchanges_; }
  const CodistillOptions& options() const { return options_; }
  const nn::Module& model() const { return *model_; }

 private:
  comm::CommunicatorPtr comm_;
  std::shared_ptr<nn::Module> model_;
  std::vector<std::shared_ptr<nn::Module>> peers_;
  CodistillOptions options_;
  std::int64_t last_exchange_step_ = -1, exchanges_ = 0;
};

// Codistillation around the run's own objective (classification; language modelling, whose
// positions are the rows): training steps from the burn-in on minimize
//   (1 - alpha) base loss + alpha T^2 KL(p_peers^T || softmax(logits / T)),
// while the metrics stay the base objective's (its loss among them: the curves compare with
// independent training directly), and evaluation, the model in eval mode, measures the base alone.
class CodistillObjective : public nn::Objective {
 public:
  // `step`: the optimizer steps taken so far (the trainer's global step).
  CodistillObjective(std::shared_ptr<const nn::Objective> base,
                     std::shared_ptr<const Codistiller> codistiller,
                     std::function<std::int64_t()> step);
  nn::ObjectiveResult compute(const Tensor& outputs, const nn::Batch& batch) const override;
  double weight(const nn::Batch& batch) const override { return base_->weight(batch); }
  std::vector<std::string> metric_names(const nn::Batch& batch) const override {
    return base_->metric_names(batch);
  }
  void derive(nn::Metrics& m) const override { base_->derive(m); }
  const nn::Objective* evaluation() const override { return base_->evaluation(); }
  std::string name() const override { return "codistill(" + base_->name() + ")"; }

 private:
  std::shared_ptr<const nn::Objective> base_;
  std::shared_ptr<const Codistiller> codistiller_;
  std::function<std::int64_t()> step_;
};

// Installs a CodistillObjective around `base` (classification when null) on `trainer` (a
// one-device Trainer of the codistiller's model) and a callback that exchanges when training
// begins and after every N-th global step. With alpha 0 nothing is exchanged and the loss is the
// base objective's.
void attach(train::Trainer& trainer, std::shared_ptr<Codistiller> codistiller,
            std::shared_ptr<const nn::Objective> base = nullptr);

// How K trained copies compare on the same rows, from their logits ((N, C) each) and the labels
// (N): each copy's top-1 accuracy and cross-entropy, and the churn of every pair a < b.
struct CopiesScore {
  struct Pair {
    int a = 0, b = 0;
    Churn churn;
  };
  std::vector<double> accuracy, loss;  // per copy
  std::vector<Pair> pairs;
  double mean_accuracy() const;
  double mean_loss() const;
  double mean_churn() const;  // 0 for one copy
};
CopiesScore score_copies(const std::vector<Tensor>& logits, const Tensor& labels);

// The flattened float parameters and buffers of `model`, in state_dict order, and back.
Tensor flatten_state(const nn::Module& model);
void load_flat_state(nn::Module& model, const Tensor& flat);

}  // namespace hpm::distill
