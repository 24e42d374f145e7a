#include "hpm/cli/distributed.h"

#include <algorithm>
#include <cstdlib>

#include "hpm/comm/gloo.h"
#include "hpm/pipeline/strategy.h"

namespace hpm::cli {

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

}  // namespace

std::shared_ptr<dist::Strategy> build_strategy(const Config& cfg, const WorkerFlags& flags,
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
      return pipeline::make_pipeline(po, comm::make_gloo_communicator(where));
    }
    return pipeline::make_pipeline(po);
  }
  if (cfg.strategy == "one_device") return nullptr;
  dist::StrategyOptions so;
  so.replicas = cfg.replicas;
  so.threads = cfg.threads;
  so.seed = cfg.seed;
  so.reducer.bucket_bytes = static_cast<std::size_t>(cfg.bucket_mb * 1024.0 * 1024.0);
  so.reducer.overlap = cfg.overlap;
  so.reducer.allreduce_dtype = cfg.allreduce_dtype == "bf16" ? DType::BF16 : DType::F32;
  so.algorithm = comm::algorithm_from_name(cfg.algorithm);
  so.timeout = std::chrono::seconds(cfg.timeout_s);
  if (cfg.strategy == "mirrored") return dist::make_mirrored(so);
  if (cfg.strategy == "central_storage") return dist::make_central_storage(so);
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
  workers->set_algorithm(so.algorithm);
  return dist::make_multi_worker_mirrored(workers, so);
}

}  // namespace hpm::cli
