// `hpm train` with a [pipeline] section trains like one device (same seed: the same test accuracy
// up to float reassociation), `hpm plan` profiles, cuts and simulates, and [pipeline] mistakes are
// config errors naming the key.
#include <gtest/gtest.h>

#include "common/hpm_cli.h"

namespace hpm::testing {
namespace {

TEST(PipelineCommand, TrainsLikeOneDeviceAndReportsTheStages) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 256, 64);
  const std::string config = small_mlp_config(dir, dir.path());
  const CommandResult one = run_hpm("train " + config + " --report " + (dir / "one.json"));
  ASSERT_EQ(one.code, 0) << one.output;
  const CommandResult piped =
      run_hpm("train " + config + " --report " + (dir / "pipe.json") +
              " --set pipeline.stages=2 --set pipeline.micro_batches=4"
              " --set pipeline.schedule='\"gpipe\"' --set pipeline.partition='\"uniform\"'");
  ASSERT_EQ(piped.code, 0) << piped.output;
  EXPECT_NE(piped.output.find("pipeline: 2 stages (threads), 4 micro-batches, schedule gpipe"),
            std::string::npos)
      << piped.output;
  EXPECT_NE(piped.output.find("pipeline: cut at [0,2,4]"), std::string::npos) << piped.output;
  EXPECT_NEAR(report_number(dir / "pipe.json", "test_loss"),
              report_number(dir / "one.json", "test_loss"), 1e-4);
  const auto report = nlohmann::json::parse(read_text(dir / "pipe.json"));
  EXPECT_EQ(report["pipeline"]["peak_bytes"].size(), 2u);
  EXPECT_GE(report["pipeline"]["last_step_bubble"].get<double>(), 0.0);
  // The zero-bubble schedule (backward split into B and W) trains to the same numbers.
  const CommandResult zb = run_hpm("train " + config + " --report " + (dir / "zb.json") +
                                   " --set pipeline.stages=2 --set pipeline.micro_batches=4"
                                   " --set pipeline.schedule='\"zb-h1\"'");
  ASSERT_EQ(zb.code, 0) << zb.output;
  EXPECT_NE(zb.output.find("schedule zb-h1"), std::string::npos) << zb.output;
  EXPECT_NEAR(report_number(dir / "zb.json", "test_loss"),
              report_number(dir / "one.json", "test_loss"), 1e-4);
}

TEST(PipelineCommand, OneProcessPerStageUnderTheLauncher) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 256, 64);
  const std::string config = small_mlp_config(dir, dir.path());
  const CommandResult one = run_hpm("train " + config + " --report " + (dir / "one.json"));
  ASSERT_EQ(one.code, 0) << one.output;
  const std::string stages = " --set pipeline.stages=2 --set pipeline.micro_batches=4";
  const CommandResult two = run_hpm("launch -n 2 -- " + hpm_binary() + " train " + config +
                                    " --report " + (dir / "two.json") + stages);
  ASSERT_EQ(two.code, 0) << two.output;
  EXPECT_NE(two.output.find("pipeline: 2 stages (processes), 4 micro-batches"), std::string::npos)
      << two.output;
  EXPECT_NEAR(report_number(dir / "two.json", "test_loss"),
              report_number(dir / "one.json", "test_loss"), 1e-4);
  const CommandResult three =
      run_hpm("launch -n 3 -- " + hpm_binary() + " train " + config + stages);
  EXPECT_NE(three.code, 0);
  EXPECT_NE(three.output.find("stages = 2 needs as many processes, 3 were launched"),
            std::string::npos)
      << three.output;
}

TEST(PipelineCommand, PlanPrintsPartitionPredictionAndProjection) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 64, 16);
  const std::string config =
      small_mlp_config(dir, dir.path(), "[pipeline]\nstages = 2\nmicro_batches = 4\n");
  const CommandResult r = run_hpm("plan " + config + " --project --report " + (dir / "plan.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* want : {"partition (balanced)", "imbalance", "predicted step",
                           "predicted bubble", "stage 1: busy", "projection", "  64 "}) {
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
  const auto plan = nlohmann::json::parse(read_text(dir / "plan.json"));
  EXPECT_EQ(plan["boundaries"].size(), 3u);
  EXPECT_NEAR(plan["formula_bubble"].get<double>(), 1.0 / 5.0, 1e-12);
  EXPECT_EQ(plan["projection"].size(), 18u);
}

TEST(PipelineCommand, MistakesAreConfigErrorsNamingTheKey) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 32, 16);
  const std::string config = small_mlp_config(dir, dir.path(), "[pipeline]\nstages = 2\n");
  struct Case {
    const char* set;
    const char* message;
  };
  for (const Case& c :
       std::vector<Case>{{"pipeline.schedule='\"zb\"'", "unknown pipeline schedule 'zb'"},
                         {"pipeline.partition='\"greedy\"'", "unknown partition 'greedy'"},
                         {"pipeline.micro_batches=32", "exceeds [data] batch_size"},
                         {"pipeline.stagez=2", "unknown key 'stagez' in [pipeline]"},
                         {"strategy.kind='\"mirrored\"'", "does not combine with [strategy]"},
                         {"pipeline.schedule='\"interleaved\"'", "at least 2 chunks per stage"},
                         {"train.accumulation_steps=2", "accumulation_steps must stay 1"},
                         {"memory.offload=true", "offload is for one device"}}) {
    const CommandResult r = run_hpm("train " + config + " --set " + c.set);
    EXPECT_EQ(r.code, 1) << c.set << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.set << "\n" << r.output;
  }
}

}  // namespace
}  // namespace hpm::testing
