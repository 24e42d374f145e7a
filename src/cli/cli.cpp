// `hpm` subcommands. Exit codes: 0 success, 1 bad input (config, data, checkpoint), 2 usage,
// 3 training stopped on a non-finite loss.
#include "hpm/cli/cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "hpm/cli/bench.h"
#include "hpm/cli/distill_command.h"
#include "hpm/cli/export_command.h"
#include "hpm/cli/fault_tolerance.h"
#include "hpm/cli/launch_command.h"
#include "hpm/cli/options.h"
#include "hpm/cli/plan.h"
#include "hpm/cli/plot.h"
#include "hpm/cli/ps_command.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/cli/sample_command.h"
#include "hpm/cli/tokenizer_command.h"
#include "hpm/comm/communicator.h"
#include "hpm/comm/gloo.h"
#include "hpm/config/strategy.h"
#include "hpm/config/training_run.h"
#include "hpm/data/image_codec.h"
#include "hpm/data/in_memory.h"
#include "hpm/distribute/ps/checkpoint.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/example.h"
#include "hpm/io/idx.h"
#include "hpm/io/tfrecord.h"
#include "hpm/tensor/device.h"
#include "hpm/trace/trace.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/tensorboard.h"
#include "hpm/train/trainer.h"

namespace hpm::cli {

namespace {

struct Common {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string report;
  int threads = 0;
  std::int64_t seed = -1;
  std::string device;
};

// `config_required` false: a command that can take the configuration a checkpoint recorded.
void add_common(CLI::App* cmd, Common& c, bool config_required = true) {
  add_config_flags(cmd, c.config_path, c.overrides, "TOML run configuration", &c.report,
                   !config_required);
  cmd->add_option("--threads", c.threads, "intra-op threads (default: [train] threads, else 1)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--seed", c.seed, "random seed (overrides [train] seed)")->check(seed_range());
  cmd->add_option("--device", c.device,
                  "where to run: cpu, cuda or cuda:N (overrides [train] device)");
}

// The command's configuration: its config file with --set and --device applied; or, for a command
// reading `checkpoint` or `weights`, the one they recorded when no file is given
// (config_for_checkpoint, config_for_weights).
Config configure(const Common& c, const std::string& checkpoint = "",
                 const std::string& weights = "") {
  std::vector<std::string> overrides = c.overrides;
  if (!c.device.empty()) overrides.push_back("train.device=" + c.device);  // after --set: it wins
  Config cfg = !checkpoint.empty() ? config_for_checkpoint(c.config_path, checkpoint, overrides)
               : !weights.empty()  ? config_for_weights(c.config_path, weights, overrides)
                                   : load_config(c.config_path, overrides);
  if (c.threads > 0) cfg.threads = c.threads;
  if (c.seed >= 0) cfg.seed = static_cast<std::uint64_t>(c.seed);
  use_threads(cfg.threads);
  return cfg;
}

int run_train(const Common& c, const std::string& resume, const WorkerFlags& worker) {
  Config cfg = configure(c);
  // Several processes (hpm launch, mpirun) but a strategy of one process: each would train the
  // same copy and write the same files, without a word.
  if (!cfg.pipeline.present && cfg.strategy != "multi_worker_mirrored" && worker.rank < 0) {
    if (const auto env = comm::gloo_options_from_env(); env && env->world_size > 1) {
      refuse_setting(cfg, "strategy", "kind",
                     "= \"" + cfg.strategy + "\" runs in one process, but this is one of " +
                         std::to_string(env->world_size) +
                         " processes (hpm launch, mpirun): each would train its own identical "
                         "copy. Use kind = \"multi_worker_mirrored\" (or [pipeline] stages = " +
                         std::to_string(env->world_size) + "), or run one process");
    }
  }
  TrainingRun run = make_training_run(cfg, worker);
  const std::shared_ptr<distribute::Strategy>& strategy = run.strategy;
  const std::shared_ptr<nn::Module>& model = run.model;
  train::Trainer& trainer = *run.trainer;
  // In a multi-worker job only worker 0 speaks (progress, report); the others report errors.
  const bool chief = run.chief;
  const std::int64_t train_examples = run.train_examples;
  const data::LabelledData test = test_set(cfg);
  if (chief) add_loggers(trainer, cfg);
  // Early stopping runs on every worker, not only the chief: each sees the same metrics (losses
  // are all-reduced, replicas identical), so all stop after the same epoch; a chief stopping
  // alone would leave the others waiting in a collective.
  std::shared_ptr<train::EarlyStopping> early;
  if (cfg.early_stopping) {
    early = std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{
        cfg.early_stopping_monitor, cfg.early_stopping_mode, cfg.early_stopping_min_delta,
        cfg.early_stopping_patience, cfg.early_stopping_restore_best_weights});
    trainer.add_callback(early);
  }
  if (!cfg.best_checkpoint_dir.empty() && chief) {
    trainer.add_callback(std::make_shared<train::BestModelCheckpoint>(cfg.best_checkpoint_dir,
                                                                      cfg.best_checkpoint_monitor));
  }

  train::FitOptions& fo = run.fit;
  fo.resume_from = resume;
  fo.backup_dir = cfg.backup_dir;
  fo.backup_every_steps = cfg.backup_every_steps;
  fo.keep_backup = cfg.keep_backup;
  // SIGTERM/SIGINT finish the step and back up, when there is somewhere to back up to.
  if (!cfg.backup_dir.empty()) fo.stop_signal = install_preemption_handlers();
  trainer.add_callback(std::make_shared<BackupReport>());
  if (auto fault = fault_injector_from_env(strategy ? strategy->worker_rank() : 0)) {
    trainer.add_callback(fault);
  }

  if (chief) {
    std::printf("hpm train %s: %lld parameters, ", cfg.path.c_str(),
                static_cast<long long>(model->num_parameters()));
    if (cfg.token_source()) {  // windows drawn by step: the run's length is its steps
      std::printf("%lld steps", static_cast<long long>(cfg.max_steps));
    } else {
      if (cfg.by_steps()) std::printf("%lld steps over ", static_cast<long long>(cfg.max_steps));
      std::printf("%lld training", static_cast<long long>(train_examples));
    }
    std::printf(" / %lld %s examples, batch %lld, %d thread(s)",
                static_cast<long long>(test.size()), cfg.token_source() ? "validation" : "test",
                static_cast<long long>(cfg.batch_size), cfg.threads);
    if (cfg.device != "cpu") std::printf(", on %s", trainer.device().id().str().c_str());
    if (cfg.pipeline.present) {
      // One model, cut: replicas would say nothing here; the cut and the schedule do.
      std::printf(", pipeline: %d stages (%s), %d micro-batches, schedule %s", cfg.pipeline.stages,
                  strategy && strategy->num_workers() > 1 ? "processes" : "threads",
                  cfg.pipeline.micro_batches, cfg.pipeline.schedule.c_str());
    } else if (strategy) {
      std::printf(", strategy %s: %d replica(s) in sync (%d worker(s) x %d)",
                  strategy->name().c_str(), strategy->num_replicas_in_sync(),
                  strategy->num_workers(), strategy->local_replicas());
    }
    std::printf("\n");
  }
  std::string timeline = cfg.timeline;
  if (!timeline.empty() && strategy && strategy->num_workers() > 1)
    timeline += ".rank" + std::to_string(strategy->worker_rank());
  if (!timeline.empty()) {
    io::output_file_target(timeline);  // before training, not after it
    trace::start();
  }
  train::FitResult r;
  if (cfg.device_budget_mb > 0 && !cfg.pipeline.present)  // [memory]: what training may hold
    trainer.device().set_budget(static_cast<std::size_t>(cfg.device_budget_mb * 1024.0 * 1024.0));
  try {
    r = trainer.fit(run.pipeline, &test, fo);
  } catch (const train::TrainingError& e) {
    std::string last;
    if (!cfg.checkpoint_dir.empty() && std::filesystem::exists(cfg.checkpoint_dir + "/latest")) {
      last = cfg.checkpoint_dir + "/" + io::read_file(cfg.checkpoint_dir + "/latest");
      while (!last.empty() && last.back() == '\n') last.pop_back();
    }
    std::fprintf(
        stderr, "hpm: error: %s; %s\n", e.what(),
        last.empty() ? "no checkpoint was written" : ("last good checkpoint: " + last).c_str());
    return dynamic_cast<const train::OutOfMemoryStop*>(&e) != nullptr ? kExitOutOfMemory : 3;
  }
  if (!timeline.empty()) {
    trace::stop();
    const std::string& path = timeline;
    const bool svg = path.size() > 4 && path.compare(path.size() - 4, 4, ".svg") == 0;
    io::write_file_atomic(
        path,
        svg ? trace::svg(trace::events(), "hpm train " + cfg.path + " (" +
                                              (strategy ? strategy->name() : "one_device") + ")")
            : trace::chrome_json(trace::events()));
  }
  if (r.preempted) {
    if (chief) {
      std::fprintf(stderr,
                   "hpm: preempted after global step %lld; backup written to %s: run the same "
                   "command again to continue\n",
                   static_cast<long long>(trainer.state().global_step), cfg.backup_dir.c_str());
    }
    return kExitPreempted;
  }
  if (!chief) return 0;
  if (r.steps == 0) {
    // Continued from a checkpoint or backup that already holds the whole run: say so, rather
    // than report a "finished" run that trained nothing.
    std::fprintf(stderr,
                 "hpm: nothing left to train: the run %s is at global step %lld, its end (raise "
                 "[train] %s to train further)\n",
                 !resume.empty() ? ("resumed from " + resume).c_str()
                                 : ("continued from " + r.restored_from).c_str(),
                 static_cast<long long>(trainer.state().global_step),
                 cfg.by_steps() ? "max_steps" : "epochs");
  }
  if (early && early->stopped_epoch() >= 0) {
    std::printf("early stopping after epoch %lld: best %s %.4f at epoch %lld%s\n",
                static_cast<long long>(early->stopped_epoch() + 1),
                cfg.early_stopping_monitor.c_str(), early->best(),
                static_cast<long long>(early->best_epoch() + 1),
                cfg.early_stopping_restore_best_weights ? " (its weights restored)" : "");
  }
  const train::EvalResult ev = trainer.evaluate(test);
  const bool text = cfg.token_source();
  // A language model's figures are per token, on the validation split.
  const double tokens_per_s =
      text ? r.samples_per_s() * static_cast<double>(cfg.gpt.block_size) : 0;
  if (text) {
    std::printf(
        "val loss %.4f, val perplexity %.2f, val token accuracy %.4f, %.0f training tokens/s, %.1f "
        "s\n",
        ev.loss, std::exp(ev.loss), ev.accuracy, tokens_per_s, r.seconds);
  } else {
    std::printf("test accuracy %.4f, test loss %.4f, %.0f training samples/s, %.1f s\n",
                ev.accuracy, ev.loss, r.samples_per_s(), r.seconds);
  }
  if (const nlohmann::json pj = pipeline_report_json(strategy.get()); !pj.is_null()) {
    std::printf("pipeline: cut at %s (imbalance %.2f); last step %.1f ms, bubble %.1f%%\n",
                pj["boundaries"].dump().c_str(), pj["imbalance"].get<double>(),
                1e3 * pj["last_step_s"].get<double>(), 100 * pj["last_step_bubble"].get<double>());
  }
  nlohmann::json history = nlohmann::json::array();
  for (const auto& e : r.history) {
    nlohmann::json metrics = nlohmann::json::object();  // whatever the objective names
    for (const auto& m : e.train_metrics.entries()) metrics[m.name] = m.mean();
    history.push_back({{"epoch", e.epoch + 1},
                       {"train_loss", e.train_loss},
                       {"train_accuracy", e.train_accuracy},
                       {"train_metrics", metrics},
                       {"test_loss", e.test_loss},
                       {"test_accuracy", e.test_accuracy},
                       {"samples_per_s", e.samples_per_s},
                       {"input_bound", e.input_bound},
                       {"lr", e.lr}});
  }
  write_report(c.report,
               {{"test_accuracy", ev.accuracy},
                {"test_loss", ev.loss},
                {"train_samples_per_s", r.samples_per_s()},
                {"epochs", trainer.state().epoch},
                {"steps", trainer.state().global_step},
                {"steps_this_run", r.steps},
                {"seconds", r.seconds},
                {"train_seconds", r.train_seconds},
                {"step_peak_bytes", r.step_peak_bytes},
                {"device_peak_bytes", r.device_peak_bytes},
                {"device", trainer.device().id().str()},
                {"input_wait_seconds", r.input_wait_seconds},
                {"threads", cfg.threads},
                {"strategy", strategy ? strategy->name() : std::string("one_device")},
                {"replicas_in_sync", strategy ? strategy->num_replicas_in_sync() : 1},
                {"gradient_wait_seconds", strategy ? strategy->gradient_wait_seconds() : 0.0},
                {"batch_size", cfg.batch_size},
                {"parameters", model->num_parameters()},
                {"checkpoint", r.last_checkpoint},
                {"restored_from", r.restored_from},
                {"backups", r.backups},
                {"backup_seconds", r.backup_seconds},
                {"backup_bytes", r.backup_bytes},
                {"pipeline", pipeline_report_json(strategy.get())},
                {"early_stopped_epoch", early && early->stopped_epoch() >= 0
                                            ? nlohmann::json(early->stopped_epoch() + 1)
                                            : nlohmann::json()},
                {"history", history},
                {"train_tokens_per_s", text ? nlohmann::json(tokens_per_s) : nlohmann::json()},
                {"val_loss", text ? nlohmann::json(ev.loss) : nlohmann::json()},
                {"val_perplexity", text ? nlohmann::json(std::exp(ev.loss)) : nlohmann::json()}});
  return 0;
}

int run_evaluate(Common c, std::string checkpoint, std::string weights) {
  positional_checkpoint(c.config_path, checkpoint, &weights);
  if (checkpoint.empty() == weights.empty()) {
    throw ConfigError(
        "hpm evaluate: give a checkpoint directory or a .safetensors weights file (one): hpm "
        "evaluate CKPT, or hpm evaluate [CONFIG] --checkpoint DIR | --weights FILE");
  }
  Config cfg = configure(c, checkpoint, weights);
  // As [model] init_from loads it: every weight of the model, each of the right shape, unless
  // the config says init_strict = false.
  if (!weights.empty()) cfg.init_from = weights;
  auto model = build_model(cfg);
  if (const std::string ps =
          checkpoint.empty() ? "" : distribute::ps::ps_checkpoint_dir(checkpoint);
      !ps.empty()) {
    // A parameter-server job's: the servers' variables; what they do not hold (an integer
    // buffer, which stays with the workers) keeps the model's initial value.
    nn::NamedTensors held =
        distribute::ps::ps_checkpoint_weights(distribute::ps::read_ps_checkpoint(ps));
    for (const auto& [name, t] : model->state_dict()) {
      const bool saved = std::any_of(held.begin(), held.end(),
                                     [&, n = name](const auto& h) { return h.first == n; });
      if (!saved) held.emplace_back(name, t);
    }
    model->load_weights(held);
  } else if (!checkpoint.empty()) {
    check_checkpoint_tokenizer(train::load_checkpoint(checkpoint, *model, nullptr), cfg,
                               "the checkpoint " + checkpoint);
  }
  auto optimizer = build_optimizer(cfg, *model);
  const data::LabelledData test = test_set(cfg);
  train::Trainer trainer(model, optimizer);
  if (cfg.device != "cpu") trainer.set_device(config_device(cfg));
  // Scored as training scores it: a GPT by next-token loss, token accuracy and perplexity.
  trainer.set_objective(build_objective(cfg));
  const train::EvalResult ev = trainer.evaluate(test);
  const bool text = cfg.token_source();
  if (text) {
    std::printf(
        "val loss %.4f, val perplexity %.2f, val token accuracy %.4f on %lld windows of %lld "
        "tokens\n",
        ev.loss, std::exp(ev.loss), ev.accuracy, static_cast<long long>(ev.samples),
        static_cast<long long>(cfg.gpt.block_size));
  } else {
    std::printf("test accuracy %.4f, test loss %.4f on %lld examples\n", ev.accuracy, ev.loss,
                static_cast<long long>(ev.samples));
  }
  write_report(c.report,
               {{"test_accuracy", ev.accuracy},
                {"test_loss", ev.loss},
                {"examples", ev.samples},
                {"checkpoint", checkpoint},
                {"weights", weights},
                {"val_loss", text ? nlohmann::json(ev.loss) : nlohmann::json()},
                {"val_perplexity", text ? nlohmann::json(std::exp(ev.loss)) : nlohmann::json()}});
  return 0;
}

int run_data_bench(const Common& c, std::int64_t epochs) {
  Config cfg = configure(c);
  std::int64_t train_examples = 0;
  const data::Dataset pipeline = training_pipeline(cfg, &train_examples);
  std::int64_t elements = 0, batches = 0;
  double seconds = 0;
  std::vector<data::StageStats> stats;
  for (std::int64_t epoch = 0; epoch < epochs; ++epoch) {
    auto it = pipeline.make_iterator(epoch);
    const auto t0 = std::chrono::steady_clock::now();
    data::Element e;
    while (it->next(e)) {
      elements += e.empty() ? 0 : e[0].size(0);
      ++batches;
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats.clear();
    it->stats(stats);
  }
  const double rate = seconds > 0 ? static_cast<double>(elements) / seconds : 0.0;
  std::printf("hpm data bench %s: %lld elements in %lld batches, %.0f elements/s\n",
              cfg.path.c_str(), static_cast<long long>(elements), static_cast<long long>(batches),
              rate);
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& st : stats) {
    std::printf(
        "  %-16s parallelism %2d  buffer %3lld  occupancy %4.0f%%  %8.1f us/output  consumer "
        "waited %4.1f%%%s\n",
        st.name.c_str(), st.parallelism, static_cast<long long>(st.buffer_size),
        100.0 * st.buffer_occupancy, 1e6 * st.seconds_per_element, 100.0 * st.wait_fraction,
        st.autotuned ? "  (autotuned)" : "");
    stages.push_back({{"name", st.name},
                      {"elements", st.elements},
                      {"parallelism", st.parallelism},
                      {"buffer_size", st.buffer_size},
                      {"buffer_occupancy", st.buffer_occupancy},
                      {"seconds_per_output", st.seconds_per_element},
                      {"errors_skipped", st.errors_skipped},
                      {"consumer_wait_fraction", st.wait_fraction},
                      {"autotuned", st.autotuned}});
  }
  write_report(c.report, {{"elements_per_s", rate},
                          {"elements", elements},
                          {"batches", batches},
                          {"epochs", epochs},
                          {"seconds", seconds},
                          {"stages", stages}});
  return 0;
}

struct ConvertOptions {
  std::string dir = "/usr/share/datasets/fashion-mnist", out, compression = "none",
              image_format = "raw";
  int shards = 4;
};

// Fashion-MNIST as sharded TFRecord files of tf.train.Example {image: 784 raw bytes, label: int64}.
int run_data_convert(const ConvertOptions& o) {
  const io::Compression compression = io::compression_from_name(o.compression);
  io::ensure_directory(o.out);
  const std::string ext = compression == io::Compression::Gzip   ? ".tfrecord.gz"
                          : compression == io::Compression::Zlib ? ".tfrecord.zlib"
                                                                 : ".tfrecord";
  for (const char* split : {"train", "t10k"}) {
    const io::IdxArray images = io::read_idx(o.dir + "/" + split + "-images-idx3-ubyte.gz");
    const io::IdxArray labels = io::read_idx(o.dir + "/" + split + "-labels-idx1-ubyte.gz");
    const std::int64_t n = images.dims[0];
    const std::size_t image_bytes = images.data.size() / static_cast<std::size_t>(n);
    for (int shard = 0; shard < o.shards; ++shard) {
      char name[96];
      std::snprintf(name, sizeof name, "/%s-%05d-of-%05d", split, shard, o.shards);
      const std::string path = o.out + name + ext;
      io::TfRecordWriter w(path, compression);
      std::int64_t count = 0;
      for (std::int64_t i = shard; i < n; i += o.shards) {
        io::Example ex;
        const auto* img = reinterpret_cast<const char*>(images.data.data()) +
                          static_cast<std::size_t>(i) * image_bytes;
        std::string raw(img, image_bytes);
        if (o.image_format == "png") {
          const Tensor pixels =
              io::idx_to_f32(io::IdxArray{io::kIdxU8,
                                          {1, images.dims[1], images.dims[2]},
                                          std::vector<unsigned char>(raw.begin(), raw.end())},
                             1.0f / 255.0f);
          raw = data::encode_png(pixels);
        }
        ex["image"] = io::Feature::of_bytes({std::move(raw)});
        ex["label"] = io::Feature::of_ints(
            {static_cast<std::int64_t>(labels.data[static_cast<std::size_t>(i)])});
        w.write(io::encode_example(ex));
        ++count;
      }
      w.close();
      std::printf("%s: %lld records\n", path.c_str(), static_cast<long long>(count));
    }
  }
  return 0;
}

int run_data_inspect(const std::string& file, const std::string& compression) {
  io::TfRecordReader reader(file, io::compression_from_name(compression));
  std::string record;
  std::int64_t records = 0;
  struct Seen {
    io::Feature::Kind kind;
    std::size_t min_len = SIZE_MAX, max_len = 0;
    std::size_t min_bytes = SIZE_MAX, max_bytes = 0;  // per bytes value
  };
  std::map<std::string, Seen> features;
  while (reader.next(record)) {
    const io::Example ex = io::decode_example(record, file + " record " + std::to_string(records));
    for (const auto& [key, f] : ex) {
      const std::size_t len = f.kind == io::Feature::Bytes   ? f.bytes.size()
                              : f.kind == io::Feature::Float ? f.floats.size()
                                                             : f.ints.size();
      auto [it, fresh] = features.try_emplace(key, Seen{f.kind});
      it->second.min_len = std::min(it->second.min_len, len);
      it->second.max_len = std::max(it->second.max_len, len);
      for (const auto& b : f.bytes) {
        it->second.min_bytes = std::min(it->second.min_bytes, b.size());
        it->second.max_bytes = std::max(it->second.max_bytes, b.size());
      }
    }
    ++records;
  }
  std::printf("%s: %lld records\n", file.c_str(), static_cast<long long>(records));
  for (const auto& [key, s] : features) {
    std::printf("  %-12s %-10s values per record: %zu..%zu", key.c_str(),
                io::feature_kind_name(s.kind), s.min_len == SIZE_MAX ? 0 : s.min_len, s.max_len);
    if (s.max_bytes > 0) std::printf(", bytes per value: %zu..%zu", s.min_bytes, s.max_bytes);
    std::printf("\n");
  }
  return 0;
}

// Every --report of the command line, checked before any work: a missing directory, or a path
// that is a FIFO or a device, is an error now, not after the training.
void check_report_paths(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    if (const CLI::Option* o = sub->get_option_no_throw("--report"); o && o->count() > 0)
      io::output_file_target(o->as<std::string>());
    check_report_paths(*sub);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hpm: high-performance model training"};
  app.require_subcommand(1);
  Common train_opts, eval_opts;
  std::string resume, checkpoint;
  CLI::App* train_cmd = app.add_subcommand("train", "train a model described by a TOML config");
  add_common(train_cmd, train_opts);
  train_cmd->add_option("--resume", resume, "continue from a checkpoint directory");
  WorkerFlags worker;
  train_cmd
      ->add_option("--rank", worker.rank,
                   "this worker's rank (multi_worker_mirrored; else from hpm launch or mpirun)")
      ->check(non_negative_number());
  train_cmd->add_option("--world-size", worker.world_size, "number of worker processes")
      ->check(positive_number());
  train_cmd->add_option(
      "--rendezvous", worker.rendezvous,
      "HOST:PORT of rank 0's store (rank 0 hosts it), or a directory all workers share");
  train_cmd->add_option("--hostname", worker.hostname,
                        "address this worker's collectives bind to (default 127.0.0.1)");
  CLI::App* eval_cmd =
      app.add_subcommand("evaluate", "evaluate a checkpoint or a weights file on the test set");
  add_common(eval_cmd, eval_opts, false);
  std::string weights;
  eval_cmd->add_option("--checkpoint", checkpoint, "checkpoint directory");
  eval_cmd->add_option("--weights", weights,
                       "a safetensors file of the model's weights (F32, F16, BF16 or F64)");
  CLI::App* data_cmd = app.add_subcommand("data", "input pipeline tools");
  data_cmd->require_subcommand(1);
  Common bench_opts;
  std::int64_t bench_epochs = 1;
  CLI::App* bench_cmd =
      data_cmd->add_subcommand("bench", "run a config's input pipeline alone and time it");
  add_common(bench_cmd, bench_opts);
  bench_cmd->add_option("--epochs", bench_epochs, "passes over the data")->check(positive_number());
  ConvertOptions convert;
  CLI::App* convert_cmd = data_cmd->add_subcommand(
      "convert",
      "write Fashion-MNIST as sharded TFRecord files of tf.train.Example (image bytes, label)");
  convert_cmd->add_option("--dir", convert.dir, "IDX data set directory");
  convert_cmd->add_option("--out", convert.out, "output directory")->required();
  convert_cmd->add_option("--shards", convert.shards, "files per split")
      ->check(CLI::Range(1, 100000));
  convert_cmd->add_option("--compression", convert.compression, "none, zlib or gzip");
  convert_cmd->add_option("--image-format", convert.image_format, "raw (784 bytes) or png")
      ->check(CLI::IsMember({"raw", "png"}));
  std::string inspect_file, inspect_compression = "none";
  CLI::App* inspect_cmd = data_cmd->add_subcommand(
      "inspect", "count the records of a TFRecord file and list its features");
  inspect_cmd->add_option("file", inspect_file, "TFRecord file")->required();
  inspect_cmd->add_option("--compression", inspect_compression, "none, zlib or gzip");
  TokenizerCommandOptions tokenizer_opts;
  CLI::App* tokenizer_cmd = add_tokenizer_command(*data_cmd, tokenizer_opts);
  AllreduceBenchOptions allreduce_bench;
  CLI::App* perf_cmd = app.add_subcommand("bench", "measure the runtime's building blocks");
  perf_cmd->require_subcommand(1);
  CLI::App* allreduce_cmd =
      perf_cmd->add_subcommand("allreduce", "all-reduce time and bandwidth per message size");
  allreduce_cmd
      ->add_option("--backend", allreduce_bench.backend, "local (threads) or gloo (processes)")
      ->check(CLI::IsMember({"local", "gloo"}));
  allreduce_cmd
      ->add_option("--world", allreduce_bench.world,
                   "ranks (gloo: forked here unless under hpm launch)")
      ->check(CLI::Range(1, 256));
  allreduce_cmd->add_option("--sizes", allreduce_bench.sizes,
                            "comma-separated message sizes (K, M, G suffixes)");
  allreduce_cmd->add_option("--algorithm", allreduce_bench.algorithm,
                            "auto, direct, ring or recursive_doubling");
  allreduce_cmd->add_option("--report", allreduce_bench.report, "write the results as JSON");
  launch::LaunchOptions launch_opts;
  CLI::App* launch_cmd = add_launch_command(app, launch_opts);
  DistillCommandOptions distill_opts;
  CLI::App* distill_cmd = add_distill_command(app, distill_opts);
  ChurnCommandOptions churn_opts;
  CLI::App* churn_cmd = add_churn_command(app, churn_opts);
  CodistillCommandOptions codistill_opts;
  CLI::App* codistill_cmd = add_codistill_command(app, codistill_opts);
  PlanCommandOptions plan_opts;
  CLI::App* plan_cmd = add_plan_command(app, plan_opts);
  PsCommandOptions ps_opts;
  CLI::App* ps_cmd = add_ps_command(app, ps_opts);
  SampleCommandOptions sample_opts;
  CLI::App* sample_cmd = add_sample_command(app, sample_opts);
  ExportCommandOptions export_opts;
  CLI::App* export_cmd = add_export_command(app, export_opts);
  PlotCommandOptions plot_opts;
  CLI::App* plot_cmd = add_plot_command(app, plot_opts);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    watch_launcher_from_env();
    check_report_paths(app);
    if (*launch_cmd) return launch::run_launch(launch_opts);
    if (*train_cmd) return run_train(train_opts, resume, worker);
    if (*eval_cmd) return run_evaluate(eval_opts, checkpoint, weights);
    if (*export_cmd) return run_export(export_opts);
    if (*plot_cmd) return run_plot(plot_opts);
    if (*bench_cmd) return run_data_bench(bench_opts, bench_epochs);
    if (*convert_cmd) return run_data_convert(convert);
    if (*inspect_cmd) return run_data_inspect(inspect_file, inspect_compression);
    if (*tokenizer_cmd) return run_tokenizer_command(tokenizer_opts);
    if (*allreduce_cmd) return run_bench_allreduce(allreduce_bench);
    if (*distill_cmd) return run_distill(distill_opts);
    if (*churn_cmd) return run_churn(churn_opts);
    if (*codistill_cmd) return run_codistill(codistill_opts);
    if (*plan_cmd) return run_plan(plan_opts);
    if (*ps_cmd) return run_ps_command(ps_opts);
    if (*sample_cmd) return run_sample(sample_opts);
  } catch (const comm::CommError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return kExitPeerLost;
  } catch (const OutOfMemoryError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return 1;
  }
  return 2;
}

}  // namespace hpm::cli
