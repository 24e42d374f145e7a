// hpm as a C++ library: knowledge distillation of a GPT teacher into a smaller GPT student, the
// library alone (no config, no CLI). The teacher trains on the text, then a student of half the
// width and depth learns twice from the same windows: alone, and distilled (its loss blended
// with the KL divergence to the teacher's softened predictions, distill::DistillationObjective).
//   build/examples/distill_gpt ['/usr/share/games/fortunes/*'] [steps per model]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hpm/data/text_corpus.h"
#include "hpm/distill/distiller.h"
#include "hpm/nn/gpt.h"
#include "hpm/optim/optimizer.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/trainer.h"

namespace {

using namespace hpm;

constexpr std::int64_t kBlock = 64, kBatch = 12;

std::shared_ptr<nn::GPT> gpt(std::int64_t layers, std::int64_t width) {
  nn::GPTConfig c;
  c.n_layer = layers;
  c.n_head = 4;
  c.n_embd = width;
  c.block_size = kBlock;
  return std::make_shared<nn::GPT>(c);
}

// Trains `model` by steps on windows of the training text (the same windows for every model: the
// seed is shared) with an evaluation every quarter, and returns the validation loss per token.
double fit(const std::shared_ptr<nn::GPT>& model, std::shared_ptr<const nn::Objective> objective,
           const data::TextCorpus& text, const data::LabelledData& val, std::int64_t steps,
           const char* name) {
  auto optimizer = std::make_shared<optim::AdamW>(
      model->named_parameters(), optim::AdamOptions{.lr = 1e-3f, .weight_decay = 0.1f});
  train::Trainer trainer(model, optimizer);
  trainer.set_objective(std::move(objective));
  const std::int64_t every = std::max<std::int64_t>(1, steps / 4);
  train::ProgressOptions progress;
  progress.total_steps = steps;
  progress.tokens_per_sample = kBlock;
  progress.every = every;
  trainer.add_callback(std::make_shared<train::ProgressCallback>(stdout, false, progress));
  train::FitOptions options;
  options.by_steps = true;
  options.max_steps = steps;
  options.batch_size = kBatch;
  std::printf("%s: %lld parameters\n", name, static_cast<long long>(model->num_parameters()));
  trainer.fit(data::random_windows(text.train, kBlock, kBatch, /*seed=*/1, every), &val, options);
  return trainer.evaluate(val).loss;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string files = argc > 1 ? argv[1] : "/usr/share/games/fortunes/*";
  const std::int64_t steps = argc > 2 ? std::atoll(argv[2]) : 400;
  if (steps <= 0) {
    std::fprintf(stderr, "distill_gpt: steps must be a positive number, got %s\n", argv[2]);
    return 2;
  }
  set_num_threads(1);
  const data::TextCorpus text = data::load_text_corpus(files);  // bytes, torch_gpt.py's split
  const data::LabelledData val = data::validation_windows(text.val, kBlock, kBatch, 20);
  const auto lm = std::make_shared<nn::LanguageModelling>();

  manual_seed(0);
  auto teacher = gpt(4, 128);
  const double teacher_loss = fit(teacher, lm, text, val, steps, "teacher");

  manual_seed(1);  // both students start from the same weights
  auto alone = gpt(2, 64);
  manual_seed(1);
  auto distilled = gpt(2, 64);
  const double alone_loss = fit(alone, lm, text, val, steps, "student alone");
  // The teacher is frozen (eval mode, no gradients) and runs on each of the student's batches.
  auto distiller = std::make_shared<distill::Distiller>(
      std::vector<distill::Teacher>{{teacher, 1.0f}},
      distill::DistillOptions{.alpha = 0.5f, .temperature = 2.0f});
  const double distilled_loss =
      fit(distilled, std::make_shared<distill::DistillationObjective>(distiller, lm), text, val,
          steps, "student distilled");

  std::printf(
      "val loss per token: teacher %.4f, student alone %.4f, student distilled %.4f (%+.4f)\n",
      teacher_loss, alone_loss, distilled_loss, distilled_loss - alone_loss);
  return 0;
}
