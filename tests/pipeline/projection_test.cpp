// pipeline::project_schedules: with chunks of equal time and free messages, the simulated bubble
// of each schedule is its closed form, and a schedule's step over the ideal is 1 / (1 - bubble).
#include "hpm/pipeline/projection.h"

#include <gtest/gtest.h>

namespace hpm::pipeline {
namespace {

TEST(Projection, EvenChunksGiveEachSchedulesClosedFormBubble) {
  const std::vector<ProjectedSchedule> rows = project_schedules(1.0, 2.0, 1.0);
  ASSERT_EQ(rows.size(), 6u * 3u * 4u) << "K in 2..64, three M each, four schedules";
  EXPECT_EQ(rows.front().stages, 2);
  EXPECT_EQ(rows.front().micro_batches, 2);
  EXPECT_EQ(rows.front().kind, ScheduleKind::kGPipe);
  EXPECT_EQ(rows.back().stages, 64);
  EXPECT_EQ(rows.back().micro_batches, 512);
  EXPECT_EQ(rows.back().kind, ScheduleKind::kZeroBubbleH1);
  for (const ProjectedSchedule& p : rows) {
    SCOPED_TRACE(std::string(schedule_name(p.kind)) + " K " + std::to_string(p.stages) + " M " +
                 std::to_string(p.micro_batches));
    EXPECT_GE(p.step_over_ideal, 1.0 - 1e-9);
    EXPECT_NEAR(p.step_over_ideal, 1.0 / (1.0 - p.bubble), 1e-9);
    if (p.kind == ScheduleKind::kGPipe || p.kind == ScheduleKind::kOneFOneB) {
      // (K - 1) / (M + K - 1) for both: 1F1B saves memory, not time.
      EXPECT_NEAR(p.bubble, (p.stages - 1.0) / (p.micro_batches + p.stages - 1.0), 1e-9);
      EXPECT_NEAR(p.bubble, p.formula_bubble, 1e-9);
    }
  }
}

}  // namespace
}  // namespace hpm::pipeline
