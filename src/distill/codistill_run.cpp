#include "hpm/distill/codistill_run.h"

#include <chrono>

#include "hpm/comm/gloo.h"
#include "hpm/comm/local.h"
#include "hpm/config/datasets.h"
#include "hpm/config/training_run.h"
#include "hpm/data/in_memory.h"
#include "hpm/data/text_corpus.h"
#include "hpm/distill/distiller.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/train/trainer.h"

namespace hpm::distill {

namespace {

using config::ConfigError;
using config::format_line;

struct CopyResult {
  double seconds = 0;
  std::int64_t exchanges = 0, steps = 0;
  Tensor all_logits;  // (K, N, C): every copy's test logits (allgathered); a language model's
                      // positions are its rows
};

// Trains copy `comm->rank()` of cfg's model; a collective at the end gathers all copies' logits.
CopyResult train_copy(const config::Config& cfg, comm::CommunicatorPtr comm,
                      const data::LabelledData& train, const data::LabelledData& test) {
  const int rank = comm->rank(), copies = comm->size();
  config::Config ccfg = cfg;
  ccfg.seed = cfg.seed + static_cast<std::uint64_t>(rank);
  set_num_threads(cfg.threads);
  // This copy's random stream: initialization and dropout draw from it, whatever thread runs it.
  Generator gen(ccfg.seed);
  ThreadGeneratorGuard guard(gen);

  const bool lm = cfg.token_source();
  auto model = config::build_model(ccfg);
  train::Trainer trainer(model, config::build_optimizer(ccfg, *model),
                         config::build_schedule(ccfg));
  const CodistillOptions options{cfg.codistill.exchange_every, cfg.codistill.burn_in,
                                 cfg.codistill.alpha, cfg.codistill.temperature};
  auto codistiller = std::make_shared<Codistiller>(
      std::move(comm), model,
      [&] { return std::shared_ptr<nn::Module>(config::build_model(ccfg)); }, options);
  attach(trainer, codistiller, config::build_objective(ccfg));  // with [train] label_smoothing
  // Each copy's CSV and TensorBoard run beside the config's ("m-copy-1.csv"); copy 0 speaks.
  config::add_loggers(trainer, ccfg, "copy-" + std::to_string(rank), /*progress=*/rank == 0);
  train::FitOptions fo = config::fit_options(ccfg);
  if (!fo.checkpoint_dir.empty()) fo.checkpoint_dir += "/copy-" + std::to_string(rank);
  fo.backup_dir.clear();
  train::FitResult fit;
  if (lm) {
    // Windows of this copy's part of the corpus (disjoint: part r of the training tokens), drawn
    // from the copy's own seed; the validation split is evaluated every eval_every steps.
    data::TokenSequence tokens = config::training_tokens(cfg);
    if (cfg.codistill.shards == "disjoint") {
      const std::int64_t part = tokens.size() / copies;
      tokens = data::TokenSequence(tokens.to_tensor().narrow(rank * part, part).clone());
    }
    fit = trainer.fit(
        data::random_windows(tokens, cfg.gpt.block_size, cfg.batch_size, ccfg.seed, cfg.eval_every),
        &test, fo);
  } else {
    data::InputPipelineSpec spec = config::pipeline_spec(ccfg);
    if (cfg.codistill.shards == "disjoint") {
      spec.num_shards = copies;
      spec.shard_index = rank;
    }
    fit = trainer.fit(config::in_stretches(cfg, data::build_input_pipeline(train, spec)), nullptr,
                      fo);
  }

  CopyResult out;
  out.seconds = fit.seconds;
  out.steps = fit.steps;
  out.exchanges = codistiller->exchanges();
  const Tensor logits = predict_logits(*model, test.inputs, lm ? 16 : 1000);
  out.all_logits = Tensor::empty({copies, logits.size(0), logits.size(1)});
  codistiller->communicator()
      .allgather(logits.reshape({logits.numel()}), out.all_logits.reshape({out.all_logits.numel()}))
      ->wait();
  return out;
}

// The training rows, cut to a multiple of `copies` so that disjoint shards have equal sizes (and
// every copy takes the same number of steps: the exchanges are collectives).
data::LabelledData training_rows(const config::Config& cfg, int copies) {
  const data::LabelledData d = data::load_mnist_split(cfg.data_dir, "train").first(cfg.train_limit);
  const std::int64_t n = d.size() - (cfg.codistill.shards == "disjoint" ? d.size() % copies : 0);
  return {d.inputs.narrow(0, n), d.labels.narrow(0, n)};
}

void check_codistillation(const config::Config& cfg) {
  if (!cfg.codistill.present) {
    throw ConfigError(cfg.path +
                      ": hpm codistill needs a [codistill] section (copies, "
                      "exchange_every, burn_in, alpha, temperature, shards)");
  }
  if (cfg.strategy != "one_device" || (cfg.source != "idx" && !cfg.token_source())) {
    throw ConfigError(cfg.path +
                      ": hpm codistill trains each copy on one device from the [data] "
                      "dir's IDX files or a language model's text or token shards ([strategy] "
                      "kind one_device, source \"idx\", \"text\" or \"tokens\")");
  }
  if (cfg.pipeline.present) {
    config::refuse_setting(
        cfg, "pipeline", "",
        "does not apply to hpm codistill: each copy trains whole, on one device");
  }
  config::refuse_train_only_settings(cfg, "hpm codistill");
  if (cfg.distill.present) {
    config::refuse_setting(
        cfg, "distill", "",
        "does not apply to hpm codistill: the copies teach each other ([codistill])");
  }
  if (cfg.recompute != "never" || cfg.offload) {
    config::refuse_setting(cfg, "memory", cfg.offload ? "offload" : "recompute",
                           "is not applied by hpm codistill yet: each copy keeps every activation");
  }
  if (!cfg.backup_dir.empty()) {
    config::refuse_setting(cfg, "train", "backup_dir",
                           "is not supported by hpm codistill: no copy writes a backup "
                           "(checkpoint_dir keeps each copy's checkpoints, under copy-R)");
  }
  config::refuse_device_but_cpu(cfg, "hpm codistill", "its copies train on the CPU");
}

// Every copy's accuracy, loss and the churn between each pair, from copy `mine`'s gathered logits
// rows and their labels.
CodistillOutcome outcome_of(const CopyResult& mine, const Tensor& labels) {
  CodistillOutcome out;
  out.copies = static_cast<int>(mine.all_logits.size(0));
  out.steps = mine.steps;
  out.exchanges = mine.exchanges;
  out.seconds = mine.seconds;
  std::vector<Tensor> logits;
  for (int r = 0; r < out.copies; ++r) {
    logits.push_back(
        mine.all_logits.narrow(r, 1).reshape({mine.all_logits.size(1), mine.all_logits.size(2)}));
  }
  out.score = score_copies(logits, labels);
  return out;
}

}  // namespace

CodistillOutcome run_codistillation(const config::Config& cfg, const config::RunLog& log) {
  check_codistillation(cfg);
  const int copies = cfg.codistill.copies;
  const auto timeout = std::chrono::milliseconds(std::int64_t{cfg.timeout_s} * 1000);
  // Under `hpm launch -n K`: one copy per process. Otherwise threads of this one.
  const std::optional<comm::GlooOptions> from_env = comm::gloo_options_from_env();
  const bool processes = from_env.has_value() && from_env->world_size > 1;
  comm::GlooOptions env = processes ? *from_env : comm::GlooOptions{};
  if (processes && env.world_size != copies) {
    throw ConfigError(cfg.path + ": [codistill] copies = " + std::to_string(copies) +
                      " but the launch has " + std::to_string(env.world_size) +
                      " processes (one copy each)");
  }
  const bool chief = !processes || env.rank == 0;
  const config::RunLog say = chief ? log : config::RunLog();
  config::use_threads(cfg.threads);  // and each copy's thread sets its own OpenMP pool
  const bool lm = cfg.token_source();
  const data::LabelledData train = lm ? data::LabelledData{} : training_rows(cfg, copies);
  const data::LabelledData test = config::test_set(cfg);
  // Churn and accuracy are per row: a language model's per position (the next token).
  const Tensor labels = lm ? test.labels.reshape({test.labels.numel()}) : test.labels;
  if (say) {
    say(lm ? format_line(
                 "codistill (%s): %d copies of a GPT, %lld training tokens (%s shards), %lld steps",
                 cfg.path.c_str(), copies,
                 static_cast<long long>(config::training_tokens(cfg).size()),
                 cfg.codistill.shards.c_str(), static_cast<long long>(cfg.max_steps))
           : format_line("codistill (%s): %d copies, %lld training rows (%s shards), %lld epoch(s)",
                         cfg.path.c_str(), copies, static_cast<long long>(train.size()),
                         cfg.codistill.shards.c_str(), static_cast<long long>(cfg.epochs)));
  }
  CopyResult mine;
  if (processes) {
    env.timeout = timeout;
    mine = train_copy(cfg, comm::make_gloo_communicator(env), train, test);
  } else {
    // Threads of this process, one copy each; copy 0's gathered logits hold them all.
    comm::run_local_group(
        copies,
        [&](comm::CommunicatorPtr c) {
          const bool first = c->rank() == 0;
          CopyResult r = train_copy(cfg, std::move(c), train, test);
          if (first) mine = std::move(r);
        },
        timeout);
  }
  CodistillOutcome out = outcome_of(mine, labels);
  out.chief = chief;
  if (say) {
    std::string line = format_line("codistill: %d copies, test accuracy", copies);
    for (double a : out.score.accuracy) line += format_line(" %.4f", a);
    line += ", test loss";
    for (double l : out.score.loss) line += format_line(" %.4f", l);
    line += format_line(
        "; mean churn between copies %.4f (alpha %g, exchange every %lld, burn-in %lld)",
        out.score.mean_churn(), cfg.codistill.alpha,
        static_cast<long long>(cfg.codistill.exchange_every),
        static_cast<long long>(cfg.codistill.burn_in));
    say(line);
  }
  return out;
}

nlohmann::json codistillation_report(const config::Config& cfg, const CodistillOutcome& o) {
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& p : o.score.pairs) {
    pairs.push_back({{"a", p.a},
                     {"b", p.b},
                     {"churn", p.churn.churn},
                     {"good_churn", p.churn.good_churn},
                     {"bad_churn", p.churn.bad_churn}});
  }
  return {{"method", "codistill"},
          {"copies", o.copies},
          {"alpha", cfg.codistill.alpha},
          {"temperature", cfg.codistill.temperature},
          {"exchange_every", cfg.codistill.exchange_every},
          {"burn_in", cfg.codistill.burn_in},
          {"shards", cfg.codistill.shards},
          {"epochs", cfg.epochs},
          {"seed", cfg.seed},
          {"steps", o.steps},
          {"exchanges", o.exchanges},
          {"seconds", o.seconds},
          {"copy_test_accuracies", o.score.accuracy},
          {"max_steps", cfg.max_steps},
          {"mean_test_accuracy", o.score.mean_accuracy()},
          {"copy_test_losses", o.score.loss},
          {"mean_test_loss", o.score.mean_loss()},
          {"pairwise_churn", pairs},
          {"mean_churn", o.score.mean_churn()}};
}

}  // namespace hpm::distill
