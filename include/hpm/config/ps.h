// A configuration's parameter-server job in the terms of distribute::ps: the cluster ([cluster],
// [ps]; HPM_PS_CLUSTER, which `hpm launch --ps` sets, overrides the addresses), the optimizer the
// servers apply, and the training rows the workers read.
#pragma once
#include "hpm/config/config.h"
#include "hpm/data/in_memory.h"
#include "hpm/distribute/ps/client.h"
#include "hpm/distribute/ps/cluster.h"

namespace hpm::config {

distribute::ps::Cluster ps_cluster(const Config& cfg);
distribute::ps::OptimizerSpec ps_optimizer(const Config& cfg);
// [data] source = "idx" only ([data] train_limit applied); else a ConfigError.
data::LabelledData ps_training_set(const Config& cfg);

}  // namespace hpm::config
