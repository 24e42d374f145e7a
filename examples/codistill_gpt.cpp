// hpm as a C++ library: codistillation of two GPTs (Anil et al. 2018), the library alone. Two
// copies of one model train at once, each on its own thread and its own windows of the text;
// every `exchange` steps they swap parameters through a communicator (comm::make_local_group:
// threads of this process; under `hpm launch` the same code runs on Gloo between processes), and
// after a burn-in each adds a distillation term toward its peer's predictions. At the end: each
// copy's validation loss, and the prediction churn between the two (the share of tokens whose
// top-1 prediction differs), which codistillation lowers.
//   build/examples/codistill_gpt ['/usr/share/games/fortunes/*'] [steps]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hpm/comm/local.h"
#include "hpm/data/text_corpus.h"
#include "hpm/distill/codistill.h"
#include "hpm/distill/distiller.h"
#include "hpm/nn/gpt.h"
#include "hpm/optim/optimizer.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/trainer.h"

namespace {

using namespace hpm;

constexpr std::int64_t kBlock = 64, kBatch = 12;

nn::GPTConfig config() {
  nn::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = kBlock;
  return c;
}

struct Copy {
  std::shared_ptr<nn::GPT> model;
  double val_loss = 0;
};

// One copy: its own initialization and windows (seeded by its rank), the codistillation
// objective around language modelling, trained by steps.
void train_copy(comm::CommunicatorPtr comm, const data::TextCorpus& text,
                const data::LabelledData& val, std::int64_t steps, Copy& out) {
  const int rank = comm->rank();
  Generator init(100 + static_cast<std::uint64_t>(rank));
  out.model = std::make_shared<nn::GPT>(config(), init);
  auto optimizer = std::make_shared<optim::AdamW>(
      out.model->named_parameters(), optim::AdamOptions{.lr = 1e-3f, .weight_decay = 0.1f});
  train::Trainer trainer(out.model, optimizer);
  auto codistiller = std::make_shared<distill::Codistiller>(
      std::move(comm), out.model, [] { return std::make_shared<nn::GPT>(config()); },
      distill::CodistillOptions{
          .exchange_every = 25, .burn_in = steps / 4, .alpha = 0.5f, .temperature = 1.0f});
  distill::attach(trainer, codistiller, std::make_shared<nn::LanguageModelling>());
  if (rank == 0) {  // one copy speaks
    train::ProgressOptions progress;
    progress.total_steps = steps;
    progress.tokens_per_sample = kBlock;
    progress.every = std::max<std::int64_t>(1, steps / 4);
    trainer.add_callback(std::make_shared<train::ProgressCallback>(stdout, false, progress));
  }
  train::FitOptions options;
  options.by_steps = true;
  options.max_steps = steps;
  options.batch_size = kBatch;
  options.seed = 7 + static_cast<std::uint64_t>(rank);
  const std::int64_t every = std::max<std::int64_t>(1, steps / 4);
  trainer.fit(data::random_windows(text.train, kBlock, kBatch, options.seed, every), &val, options);
  out.val_loss = trainer.evaluate(val).loss;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string files = argc > 1 ? argv[1] : "/usr/share/games/fortunes/*";
  const std::int64_t steps = argc > 2 ? std::atoll(argv[2]) : 400;
  if (steps <= 0) {
    std::fprintf(stderr, "codistill_gpt: steps must be a positive number, got %s\n", argv[2]);
    return 2;
  }
  set_num_threads(1);  // a kernel thread per copy: the copies are the parallelism
  const data::TextCorpus text = data::load_text_corpus(files);
  const data::LabelledData val = data::validation_windows(text.val, kBlock, kBatch, 20);
  Copy copies[2];
  comm::run_local_group(2, [&](comm::CommunicatorPtr c) {
    const int r = c->rank();
    train_copy(std::move(c), text, val, steps, copies[r]);
  });

  const distill::Churn c = distill::churn(distill::predict_logits(*copies[0].model, val.inputs, 16),
                                          distill::predict_logits(*copies[1].model, val.inputs, 16),
                                          val.labels.reshape({val.labels.numel()}));
  std::printf("val loss per token: copy 0 %.4f, copy 1 %.4f; churn %.4f over %lld tokens\n",
              copies[0].val_loss, copies[1].val_loss, c.churn, static_cast<long long>(c.examples));
  return 0;
}
