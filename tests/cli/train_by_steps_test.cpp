// Training by steps for every model (`[train] max_steps`): an image model too, evaluated every
// eval_every steps and at the last one whether or not eval_every divides max_steps, progress
// counted in steps over the run, and a resumed run equal to one never stopped.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/hpm_cli.h"

namespace hpm {
namespace {

using namespace hpm::testing;

TEST(TrainBySteps, AnImageModelEvaluatesAtEachMultipleAndAtTheEnd) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 160, 48);  // 10 batches of 16 a pass
  const std::string cfg = small_mlp_config(dir, dir.path());
  const CommandResult r =
      run_hpm("train " + cfg + " --set train.max_steps=25 --set train.eval_every=10 --report " +
              dir / "r.json");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* line :
       {"step 10/25: train loss", "step 20/25: train loss", "step 25/25: train loss"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  EXPECT_NE(r.output.find(", val loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("samples/s"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("epoch "), std::string::npos) << "counted in steps:\n" << r.output;
  const auto j = nlohmann::json::parse(read_text(dir / "r.json"));
  EXPECT_EQ(j["steps"], 25);
  ASSERT_EQ(j["history"].size(), 3u);
  for (const auto& h : j["history"]) EXPECT_GE(h["test_loss"].get<double>(), 0) << h;
}

// Stopped at step 25 (half-way through the third pass over the data) and resumed to 40, it ends
// bit-identical to a run of 40 steps: the stretches continue the passes where they stood.
TEST(TrainBySteps, ResumedMidPassEndsAsARunNeverStopped) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 160, 48);
  const std::string cfg = small_mlp_config(dir, dir.path());
  const std::string steps = " --set train.eval_every=10 --set train.max_steps=";
  const CommandResult first =
      run_hpm("train " + cfg + steps + "25 --set train.checkpoint_dir='\"" + dir / "ckpt" + "\"'");
  ASSERT_EQ(first.code, 0) << first.output;
  const CommandResult resumed = run_hpm("train " + cfg + steps + "40 --resume " + dir / "ckpt" +
                                        " --report " + dir / "resumed.json");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  const CommandResult straight =
      run_hpm("train " + cfg + steps + "40 --report " + dir / "straight.json");
  ASSERT_EQ(straight.code, 0) << straight.output;
  EXPECT_EQ(report_number(dir / "resumed.json", "steps_this_run"), 15);
  EXPECT_EQ(report_number(dir / "resumed.json", "test_loss"),
            report_number(dir / "straight.json", "test_loss"))
      << "bit-identical, not close";
}

TEST(TrainBySteps, HowLongToTrainIsSaidOnce) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 160, 48);
  const std::string both = small_mlp_config(dir, dir.path(), "max_steps = 30\n");  // epochs = 2
  CommandResult r = run_hpm("train " + both);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("[train] epochs and max_steps both say how long to train: give one"),
            std::string::npos)
      << r.output;
  // An override of either replaces the file's other.
  TempDir dir2;
  write_synthetic_mnist(dir2.path(), 160, 48);
  const std::string epochs = small_mlp_config(dir2, dir2.path());
  r = run_hpm("train " + epochs + " --set train.max_steps=3 --report " + dir2 / "r.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(report_number(dir2 / "r.json", "steps"), 3);
  r = run_hpm("train " + epochs + " --set train.eval_every=5");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("eval_every is for training by steps: set max_steps too"),
            std::string::npos)
      << r.output;
  r = run_hpm("train " + epochs + " --set train.max_steps=3 --set train.eval_iters=5");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("an image model evaluates on its whole test set"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace hpm
