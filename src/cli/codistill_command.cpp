// `hpm codistill CONFIG`: the [codistill] section's K copies of CONFIG's model, trained together
// (Anil et al. 2018). As K threads of this process over a local communicator group, or, under
// `hpm launch -n K`, one copy per process over gloo: the same code through comm::Communicator.
// Copy r uses seed [train] seed + r (initialization, data order, dropout). At the end the copies
// allgather their test-set logits and rank 0 reports every copy's accuracy and the prediction
// churn between each pair.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "hpm/autograd/grad_mode.h"
#include "hpm/cli/distill_command.h"
#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/comm/gloo.h"
#include "hpm/comm/local.h"
#include "hpm/config/training_run.h"
#include "hpm/data/in_memory.h"
#include "hpm/data/text_corpus.h"
#include "hpm/distill/codistill.h"
#include "hpm/distill/distiller.h"
#include "hpm/io/atomic_file.h"
#include "hpm/nn/losses.h"
#include "hpm/nn/objective.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/tensorboard.h"
#include "hpm/train/trainer.h"

namespace hpm::cli {

namespace {

struct CopyResult {
  double test_accuracy = 0, test_loss = 0, seconds = 0;
  std::int64_t exchanges = 0, steps = 0;
  Tensor all_logits;  // (K, N, C): every copy's test logits (allgathered); a language model's
                      // positions are its rows
};

// Trains copy `comm->rank()` of cfg's model; a collective at the end gathers all copies' logits.
CopyResult train_copy(const Config& cfg, comm::CommunicatorPtr comm,
                      const data::LabelledData& train, const data::LabelledData& test) {
  const int rank = comm->rank(), copies = comm->size();
  Config ccfg = cfg;
  ccfg.seed = cfg.seed + static_cast<std::uint64_t>(rank);
  set_num_threads(cfg.threads);
  // This copy's random stream: initialization and dropout draw from it, whatever thread runs it.
  Generator gen(ccfg.seed);
  ThreadGeneratorGuard guard(gen);

  const bool lm = cfg.token_source();
  auto model = build_model(ccfg);
  train::Trainer trainer(model, build_optimizer(ccfg, *model), build_schedule(ccfg));
  const distill::CodistillOptions options{cfg.codistill.exchange_every, cfg.codistill.burn_in,
                                          cfg.codistill.alpha, cfg.codistill.temperature};
  auto codistiller = std::make_shared<distill::Codistiller>(
      std::move(comm), model, [&] { return std::shared_ptr<nn::Module>(build_model(ccfg)); },
      options);
  distill::attach(trainer, codistiller, build_objective(ccfg));  // with [train] label_smoothing
  // Each copy's CSV and TensorBoard run beside the config's ("m-copy-1.csv"); copy 0 speaks.
  add_loggers(trainer, ccfg, "copy-" + std::to_string(rank), /*progress=*/rank == 0);
  train::FitOptions fo = fit_options(ccfg);
  if (!fo.checkpoint_dir.empty()) fo.checkpoint_dir += "/copy-" + std::to_string(rank);
  fo.backup_dir.clear();
  train::FitResult fit;
  if (lm) {
    // Windows of this copy's part of the corpus (disjoint: half r of the training tokens), drawn
    // from the copy's own seed; the validation split is evaluated every eval_every steps.
    data::TokenSequence tokens = training_tokens(cfg);
    if (cfg.codistill.shards == "disjoint") {
      const std::int64_t part = tokens.size() / copies;
      tokens = data::TokenSequence(tokens.to_tensor().narrow(rank * part, part).clone());
    }
    fit = trainer.fit(
        data::random_windows(tokens, cfg.gpt.block_size, cfg.batch_size, ccfg.seed, cfg.eval_every),
        &test, fo);
  } else {
    data::InputPipelineSpec spec = pipeline_spec(ccfg);
    if (cfg.codistill.shards == "disjoint") {
      spec.num_shards = copies;
      spec.shard_index = rank;
    }
    fit = trainer.fit(in_stretches(cfg, data::build_input_pipeline(train, spec)), nullptr, fo);
  }

  CopyResult out;
  out.seconds = fit.seconds;
  out.steps = fit.steps;
  out.exchanges = codistiller->exchanges();
  const train::EvalResult eval = trainer.evaluate(test);
  out.test_accuracy = eval.accuracy;
  out.test_loss = eval.loss;
  const Tensor logits = distill::predict_logits(*model, test.inputs, lm ? 16 : 1000);
  out.all_logits = Tensor::empty({copies, logits.size(0), logits.size(1)});
  codistiller->communicator()
      .allgather(logits.reshape({logits.numel()}), out.all_logits.reshape({out.all_logits.numel()}))
      ->wait();
  return out;
}

// The training rows, cut to a multiple of `copies` so that disjoint shards have equal sizes (and
// every copy takes the same number of steps: the exchanges are collectives).
data::LabelledData training_rows(const Config& cfg, int copies) {
  const data::LabelledData d = data::load_mnist_split(cfg.data_dir, "train").first(cfg.train_limit);
  const std::int64_t n = d.size() - (cfg.codistill.shards == "disjoint" ? d.size() % copies : 0);
  return {d.inputs.narrow(0, n), d.labels.narrow(0, n)};
}

// Every copy's accuracy, loss and the churn between each pair, from the gathered logits rows and
// their labels (a language model's next tokens, flattened alike).
nlohmann::json report_of(const Config& cfg, const CopyResult& gathered, const Tensor& labels) {
  const int copies = static_cast<int>(gathered.all_logits.size(0));
  std::vector<Tensor> logits;
  for (int r = 0; r < copies; ++r) {
    logits.push_back(gathered.all_logits.narrow(r, 1).reshape(
        {gathered.all_logits.size(1), gathered.all_logits.size(2)}));
  }
  const distill::CopiesScore score = distill::score_copies(logits, labels);
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& p : score.pairs) {
    pairs.push_back({{"a", p.a},
                     {"b", p.b},
                     {"churn", p.churn.churn},
                     {"good_churn", p.churn.good_churn},
                     {"bad_churn", p.churn.bad_churn}});
  }
  const nlohmann::json accuracies = score.accuracy, losses = score.loss;
  std::printf("codistill: %d copies, test accuracy", copies);
  for (const auto& acc : accuracies) std::printf(" %.4f", acc.get<double>());
  std::printf(", test loss");
  for (const auto& loss : losses) std::printf(" %.4f", loss.get<double>());
  std::printf("; mean churn between copies %.4f (alpha %g, exchange every %lld, burn-in %lld)\n",
              score.mean_churn(), cfg.codistill.alpha,
              static_cast<long long>(cfg.codistill.exchange_every),
              static_cast<long long>(cfg.codistill.burn_in));
  return {{"method", "codistill"},
          {"copies", copies},
          {"alpha", cfg.codistill.alpha},
          {"temperature", cfg.codistill.temperature},
          {"exchange_every", cfg.codistill.exchange_every},
          {"burn_in", cfg.codistill.burn_in},
          {"shards", cfg.codistill.shards},
          {"epochs", cfg.epochs},
          {"seed", cfg.seed},
          {"steps", gathered.steps},
          {"exchanges", gathered.exchanges},
          {"seconds", gathered.seconds},
          {"copy_test_accuracies", accuracies},
          {"max_steps", cfg.max_steps},
          {"mean_test_accuracy", score.mean_accuracy()},
          {"copy_test_losses", losses},
          {"mean_test_loss", score.mean_loss()},
          {"pairwise_churn", pairs},
          {"mean_churn", score.mean_churn()}};
}

}  // namespace

CLI::App* add_codistill_command(CLI::App& app, CodistillCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "codistill", "train CONFIG's [codistill] copies together, distilling from each other");
  add_config_flags(cmd, o.config_path, o.overrides,
                   "TOML run configuration with a [codistill] section", &o.report);
  cmd->add_option("--threads", o.threads, "intra-op threads per copy (default: [train] threads)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--seed", o.seed, "copy 0's seed; copy r gets seed + r (overrides [train] seed)")
      ->check(seed_range());
  return cmd;
}

int run_codistill(const CodistillCommandOptions& o) {
  Config cfg = load_config(o.config_path, o.overrides);
  if (o.threads > 0) cfg.threads = o.threads;
  if (o.seed >= 0) cfg.seed = static_cast<std::uint64_t>(o.seed);
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
    refuse_setting(cfg, "pipeline", "",
                   "does not apply to hpm codistill: each copy trains whole, on one device");
  }
  refuse_train_only_settings(cfg, "hpm codistill");
  if (cfg.distill.present) {
    refuse_setting(cfg, "distill", "",
                   "does not apply to hpm codistill: the copies teach each other ([codistill])");
  }
  if (cfg.recompute != "never" || cfg.offload) {
    refuse_setting(cfg, "memory", cfg.offload ? "offload" : "recompute",
                   "is not applied by hpm codistill yet: each copy keeps every activation");
  }
  if (!cfg.backup_dir.empty()) {
    refuse_setting(cfg, "train", "backup_dir",
                   "is not supported by hpm codistill: no copy writes a backup (checkpoint_dir "
                   "keeps each copy's checkpoints, under copy-R)");
  }
  const int copies = cfg.codistill.copies;
  const auto timeout = std::chrono::milliseconds(std::int64_t{cfg.timeout_s} * 1000);
  use_threads(cfg.threads);  // and each copy's thread sets its own OpenMP pool (train_copy)
  const bool lm = cfg.token_source();
  const data::LabelledData train = lm ? data::LabelledData{} : training_rows(cfg, copies);
  const data::LabelledData test = test_set(cfg);
  // Churn and accuracy are per row: a language model's per position (the next token).
  const Tensor labels = lm ? test.labels.reshape({test.labels.numel()}) : test.labels;
  if (lm) {
    std::printf(
        "codistill (%s): %d copies of a GPT, %lld training tokens (%s shards), %lld steps\n",
        cfg.path.c_str(), copies, static_cast<long long>(training_tokens(cfg).size()),
        cfg.codistill.shards.c_str(), static_cast<long long>(cfg.max_steps));
  } else {
    std::printf("codistill (%s): %d copies, %lld training rows (%s shards), %lld epoch(s)\n",
                cfg.path.c_str(), copies, static_cast<long long>(train.size()),
                cfg.codistill.shards.c_str(), static_cast<long long>(cfg.epochs));
  }
  std::fflush(stdout);
  try {
    if (auto env = comm::gloo_options_from_env(); env && env->world_size > 1) {
      // One copy per process (hpm launch -n K).
      if (env->world_size != copies) {
        throw ConfigError(cfg.path + ": [codistill] copies = " + std::to_string(copies) +
                          " but the launch has " + std::to_string(env->world_size) +
                          " processes (one copy each)");
      }
      env->timeout = timeout;
      comm::CommunicatorPtr comm = comm::make_gloo_communicator(*env);
      const int rank = comm->rank();
      const CopyResult mine = train_copy(cfg, std::move(comm), train, test);
      // Every copy's accuracy and loss are read from the gathered logits.
      if (rank == 0) {
        const nlohmann::json report = report_of(cfg, mine, labels);
        write_report(o.report, report);
      }
      return 0;
    }
    // Threads of this process, one copy each.
    std::vector<CopyResult> results(static_cast<std::size_t>(copies));
    comm::run_local_group(
        copies,
        [&](comm::CommunicatorPtr c) {
          const int r = c->rank();
          results[static_cast<std::size_t>(r)] = train_copy(cfg, std::move(c), train, test);
        },
        timeout);
    const nlohmann::json report = report_of(cfg, results[0], labels);
    write_report(o.report, report);
  } catch (const train::TrainingError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return 3;
  }
  return 0;
}

}  // namespace hpm::cli
