#include "hpm/config/strategy.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "hpm/comm/gloo.h"
#include "hpm/io/crc32c.h"
#include "hpm/pipeline/strategy.h"
#include "hpm/tensor/random.h"

namespace hpm::config {

namespace {

comm::GlooOptions worker_options(const Config& cfg, const WorkerFlags& flags) {
  comm::GlooOptions o;
  if (flags.rank >= 0 || flags.world_size > 0 || !flags.rendezvous.empty()) {
    if (flags.rank < 0 || flags.world_size < 1 || flags.rendezvous.empty()) {
      throw ConfigError("multi_worker_mirrored: --rank, --world-size and --rendezvous go together");
    }
    o.rank = flags.rank;
    o.world_size = flags.world_size;
    o.rendezvous = flags.rendezvous;
  } else if (auto env = comm::gloo_options_from_env()) {
    o = *env;
  } else {
    throw ConfigError(cfg.path +
                      ": [strategy] kind = \"multi_worker_mirrored\" needs its peers: run it under "
                      "`hpm launch -n N --`, "
                      "under mpirun, or with --rank, --world-size and --rendezvous HOST:PORT");
  }
  if (o.rank >= o.world_size) {
    throw ConfigError("multi_worker_mirrored: rank " + std::to_string(o.rank) +
                      " is not below the world size " + std::to_string(o.world_size));
  }
  if (!flags.hostname.empty()) o.hostname = flags.hostname;
  // `hpm launch --timeout` (HPM_TIMEOUT) outranks the config: the launcher knows the cluster.
  if (std::getenv("HPM_TIMEOUT") == nullptr) o.timeout = std::chrono::seconds(cfg.timeout_s);
  return o;
}

// The settings every worker of one job must share: what the model is, what each step computes,
// how many steps there are and when the workers meet. Paths, threads, budgets and timeouts may
// differ from host to host.
std::vector<std::pair<std::string, std::string>> job_settings(const Config& c) {
  std::string model;
  {
    // Printed from a copy built on a generator of its own (the job's initialization draws stay
    // where they are) and without init_from: the workers' starting weights are worker 0's,
    // broadcast, so only the architecture must agree, and no weights file is read again.
    Generator scratch(0);
    ThreadGeneratorGuard own(scratch);
    Config architecture = c;
    architecture.init_from.clear();
    model = build_model(architecture)->repr();
  }
  std::string augment;
  const auto text = [](auto v) {
    std::ostringstream os;
    os.precision(17);
    os << v;
    return os.str();
  };
  for (const auto& a : c.augment) {  // normalize's values too: workers differing there disagreed
    augment += a.op + " " + std::to_string(a.padding) + " " + std::to_string(a.height) + "x" +
               std::to_string(a.width);
    for (float m : a.mean) augment += " mean " + text(m);
    for (float d : a.std) augment += " std " + text(d);
    augment += ";";
  }
  return {{"[model] (the layers and their sizes)", model},
          {"[data] source", c.source},
          {"[data] batch_size", text(c.batch_size)},
          {"[data] shuffle", text(c.shuffle)},
          {"[data] shuffle_buffer", text(c.shuffle_buffer)},
          {"[data] train_limit", text(c.train_limit)},
          {"[data] augment", augment},
          {"[data] deterministic", text(c.deterministic)},
          {"[data] drop_remainder", text(c.drop_remainder)},
          {"[optimizer] kind", c.optimizer},
          {"[optimizer] lr", text(c.lr)},
          {"[optimizer] momentum", text(c.momentum)},
          {"[optimizer] dampening", text(c.dampening)},
          {"[optimizer] weight_decay", text(c.weight_decay)},
          {"[optimizer] nesterov", text(c.nesterov)},
          {"[optimizer] amsgrad", text(c.amsgrad)},
          {"[optimizer] beta1", text(c.beta1)},
          {"[optimizer] beta2", text(c.beta2)},
          {"[optimizer] eps", text(c.eps)},
          {"[optimizer] weight_decay_min_rank", text(c.weight_decay_min_rank)},
          {"[schedule] kind", c.schedule},
          {"[schedule] unit", c.schedule_unit},
          {"[schedule] step_size", text(c.step_size)},
          {"[schedule] t_max", text(c.t_max)},
          {"[schedule] warmup", text(c.warmup)},
          {"[schedule] gamma", text(c.gamma)},
          {"[schedule] eta_min", text(c.eta_min)},
          {"[schedule] warmup_start_factor", text(c.warmup_start_factor)},
          {"[train] epochs", text(c.epochs)},
          {"[train] seed", text(c.seed)},
          {"[train] label_smoothing", text(c.label_smoothing)},
          {"[train] clip_grad_norm", text(c.clip_grad_norm)},
          {"[train] accumulation_steps", text(c.accumulation_steps)},
          {"[train] precision", c.precision},
          {"[train] max_steps", text(c.max_steps)},
          {"[train] eval_every", text(c.eval_every)},
          {"[train] backup_every_steps", text(c.backup_every_steps)},
          {"[train] backup_dir (set or not)", text(!c.backup_dir.empty())},
          {"[early_stopping]", c.early_stopping
                                   ? c.early_stopping_monitor + " " + c.early_stopping_mode + " " +
                                         text(c.early_stopping_min_delta) + " " +
                                         text(c.early_stopping_patience)
                                   : "off"},
          {"[strategy] kind", c.strategy},
          {"[strategy] replicas", text(c.replicas)},
          {"[strategy] bucket_mb", text(c.bucket_mb)},
          {"[strategy] overlap", text(c.overlap)},
          {"[strategy] allreduce_dtype", c.allreduce_dtype},
          {"[strategy] algorithm", c.algorithm},
          {"[strategy] shard", c.shard},
          {"[memory] recompute", c.recompute + " " + text(c.recompute_every)},
          {"[memory] offload", text(c.offload)},
          {"[pipeline]", c.pipeline.present
                             ? text(c.pipeline.stages) + " " + text(c.pipeline.micro_batches) +
                                   " " + c.pipeline.schedule + " " +
                                   text(c.pipeline.chunks_per_stage) + " " + c.pipeline.partition
                             : "none"}};
}

// Workers that disagree on the job (another seed, learning rate, activation, batch size) would
// train and exit 0 with a model none of them describes, or meet a different number of steps and
// time out as if a peer were lost. Every worker gathers every worker's CRC-32C of each setting;
// each must agree with its own.
void check_same_job(const Config& cfg, comm::Communicator& workers) {
  if (workers.size() < 2) return;
  const auto settings = job_settings(cfg);
  const auto n = static_cast<std::int64_t>(settings.size());
  std::vector<std::int64_t> mine(settings.size());
  for (std::size_t i = 0; i < settings.size(); ++i) {
    mine[i] = io::crc32c(settings[i].second.data(), settings[i].second.size());
  }
  Tensor all = Tensor::empty({n * workers.size()}, DType::I64);
  workers.allgather(Tensor::from_i64(mine, {n}), all)->wait();
  const std::vector<std::int64_t> every = all.to_vector_i64();
  std::string differ;
  bool agree_with_rank0 = true;
  for (std::size_t i = 0; i < settings.size(); ++i) {
    bool same = true;
    for (int r = 0; r < workers.size(); ++r) {
      same = same && every[static_cast<std::size_t>(r * n) + i] == mine[i];
    }
    agree_with_rank0 = agree_with_rank0 && every[i] == mine[i];
    if (same) continue;
    const std::string& v = settings[i].second;
    differ +=
        std::string(differ.empty() ? "" : "; ") + settings[i].first +
        (v.size() <= 60 && v.find('\n') == std::string::npos ? " (this worker: " + v + ")" : "");
  }
  if (!differ.empty()) {
    // Every worker sees the disagreement. Those that run rank 0's job give the others a moment
    // to report first: the error the launcher shows is then the odd worker's own, naming its
    // values (the launcher stops everyone at the first error).
    if (agree_with_rank0) std::this_thread::sleep_for(std::chrono::seconds(2));
    throw ConfigError(cfg.path + ": worker " + std::to_string(workers.rank()) + " of " +
                      std::to_string(workers.size()) +
                      " does not run the same job as the others: " + differ +
                      " differ between the workers; give every worker the same config and "
                      "--set flags");
  }
}

}  // namespace

std::shared_ptr<distribute::Strategy> build_strategy(const Config& cfg, const WorkerFlags& flags,
                                                     comm::CommunicatorPtr* workers_kept) {
  if (cfg.pipeline.present) {
    pipeline::PipelineStrategyOptions po;
    po.pipeline.stages = cfg.pipeline.stages;
    po.pipeline.micro_batches = cfg.pipeline.micro_batches;
    po.pipeline.schedule = pipeline::schedule_from_name(cfg.pipeline.schedule);
    po.pipeline.chunks_per_stage = cfg.pipeline.chunks_per_stage;
    // The stages share the process's CPU budget, as replicas do.
    po.pipeline.threads_per_stage = std::max(1, cfg.threads / cfg.pipeline.stages);
    po.pipeline.seed = cfg.seed;
    po.pipeline.timeout = std::chrono::seconds(cfg.timeout_s);
    po.partition = pipeline::partition_from_name(cfg.pipeline.partition);
    po.profile_repeats = cfg.pipeline.profile_repeats;
    // [memory] for a pipeline: recomputation per chunk and micro-batch; the budget per stage.
    po.pipeline.recompute = nn::parse_recompute_mode(cfg.recompute);
    if (cfg.device_budget_mb > 0) {
      po.pipeline.device_budget = static_cast<std::size_t>(cfg.device_budget_mb * 1024.0 * 1024.0);
    }
    // Under `hpm launch`, mpirun or --rank flags: one process per stage, over gloo.
    if (flags.rank >= 0 || flags.world_size > 0 || comm::gloo_options_from_env()) {
      const comm::GlooOptions where = worker_options(cfg, flags);
      if (where.world_size != cfg.pipeline.stages) {
        throw ConfigError(
            cfg.path + ": [pipeline] stages = " + std::to_string(cfg.pipeline.stages) +
            " needs as many processes, " + std::to_string(where.world_size) + " were launched");
      }
      po.pipeline.threads_per_stage = std::max(1, cfg.threads);
      comm::CommunicatorPtr stages = comm::make_gloo_communicator(where);
      check_same_job(cfg, *stages);
      return pipeline::make_pipeline(po, std::move(stages));
    }
    return pipeline::make_pipeline(po);
  }
  if (cfg.strategy == "one_device") return nullptr;
  distribute::StrategyOptions so;
  so.replicas = cfg.replicas;
  so.threads = cfg.threads;
  so.seed = cfg.seed;
  so.reducer.bucket_bytes = static_cast<std::size_t>(cfg.bucket_mb * 1024.0 * 1024.0);
  so.reducer.overlap = cfg.overlap;
  so.reducer.allreduce_dtype = cfg.allreduce_dtype == "bf16" ? DType::BF16 : DType::F32;
  so.algorithm = comm::algorithm_from_name(cfg.algorithm);
  so.timeout = std::chrono::seconds(cfg.timeout_s);
  if (cfg.strategy == "mirrored") return distribute::make_mirrored(so);
  if (cfg.strategy == "central_storage") return distribute::make_central_storage(so);
  const comm::GlooOptions where = worker_options(cfg, flags);
  if (cfg.shard != "batch") {
    if (cfg.batch_size % where.world_size != 0) {
      throw ConfigError(cfg.path + ": [strategy] shard = \"" + cfg.shard + "\": batch_size " +
                        std::to_string(cfg.batch_size) + " does not split evenly over " +
                        std::to_string(where.world_size) + " workers");
    }
    so.per_worker_batches = true;
  }
  comm::CommunicatorPtr workers = workers_kept != nullptr && *workers_kept
                                      ? *workers_kept
                                      : comm::make_gloo_communicator(where);
  if (workers_kept != nullptr) *workers_kept = workers;
  check_same_job(cfg, *workers);
  workers->set_algorithm(so.algorithm);
  return distribute::make_multi_worker_mirrored(workers, so);
}

}  // namespace hpm::config
