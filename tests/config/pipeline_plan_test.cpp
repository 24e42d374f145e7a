// config::plan_pipeline: a config's [pipeline] profiled, cut and simulated without running it.
#include "hpm/config/pipeline_plan.h"

#include <gtest/gtest.h>

#include "common/hpm_cli.h"
#include "common/temp_dir.h"

namespace hpm::config {
namespace {

TEST(PipelinePlan, ProfilesOneMicroBatchCutsAndSimulatesTheSchedule) {
  hpm::testing::TempDir dir;
  hpm::testing::write_synthetic_mnist(dir.path(), 64, 16);
  const Config cfg = load_config(hpm::testing::small_mlp_config(
      dir, dir.path(), "[pipeline]\nstages = 2\nmicro_batches = 4\nschedule = \"1f1b\"\n"));
  const PipelinePlan plan = plan_pipeline(cfg);
  EXPECT_EQ(plan.batch_rows, 16);
  EXPECT_EQ(plan.micro_batch_rows, 4);
  EXPECT_EQ(plan.layers.size(), plan.model->size());
  ASSERT_EQ(plan.partition.boundaries.size(), 3u);
  EXPECT_EQ(plan.partition.boundaries.front(), 0);
  EXPECT_EQ(plan.partition.boundaries.back(), static_cast<int>(plan.model->size()));
  ASSERT_EQ(plan.simulation.busy_s.size(), 2u);
  // Two stages at once beat one device doing the same micro-batches, but not by more than two.
  EXPECT_GT(plan.simulation.step_s, 0.0);
  EXPECT_LT(plan.simulation.step_s, plan.one_device_step_s * (1 + 1e-9));
  EXPECT_GT(plan.simulation.step_s * 2, plan.one_device_step_s * (1 - 1e-9));
  const nlohmann::json report = pipeline_plan_report(cfg, plan);
  EXPECT_EQ(report["schedule"], "1f1b");
  EXPECT_EQ(report["layers"].size(), plan.layers.size());
  EXPECT_EQ(report["stage"].size(), 2u);
}

}  // namespace
}  // namespace hpm::config
