// End-to-end tests of `hpm distill` and `hpm churn` on a small synthetic data set.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/hpm_cli.h"

namespace hpm {
namespace {

using namespace hpm::testing;

// A student smaller than small_mlp_config's model, distilled from the teacher config `teacher`.
std::string student_config(const TempDir& dir, const std::string& data_dir,
                           const std::string& distill_section) {
  const std::string path = dir / "student.toml";
  std::ofstream(path)
      << "[model]\nlayers = [{ type = \"flatten\" }, { type = \"linear\", in = 784, "
         "out = 8 }, { type = \"relu\" }, { type = \"linear\", in = 8, out = 10 }]\n"
      << "[data]\ndir = \"" << data_dir << "\"\nbatch_size = 16\n"
      << "[optimizer]\nkind = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
      << "[train]\nepochs = 2\n"
      << "[distill]\n"
      << distill_section;
  return path;
}

TEST(DistillCommand, TrainsTeacherFromScratchThenDistillsWithBaseline) {
  TempDir dir, teacher_dir;
  write_synthetic_mnist(dir.path(), 400, 100);
  const std::string teacher = small_mlp_config(teacher_dir, dir.path());
  const std::string ckpt = dir / "teacher_ckpt";
  const std::string cfg =
      student_config(dir, dir.path(),
                     "teacher_config = \"" + teacher + "\"\nteacher_checkpoint = \"" + ckpt +
                         "\"\nalpha = 0.5\ntemperature = 2.0\nbaseline = true\n");
  CommandResult r = run_hpm("distill " + cfg + " --report " + dir / "report.json" +
                            " --set train.tensorboard_dir=" + dir / "tb");
  ASSERT_EQ(r.code, 0) << r.output;
  // TensorBoard events: the student's in tensorboard_dir, the baseline's in a run of its own.
  for (const char* run : {"train", "validation", "baseline/train", "baseline/validation"})
    EXPECT_TRUE(std::filesystem::is_directory(dir / ("tb/" + std::string(run)))) << run;
  const std::string report = dir / "report.json";
  EXPECT_GT(report_number(report, "teacher_test_accuracy"), 0.5);
  EXPECT_GT(report_number(report, "student_test_accuracy"), 0.5);
  EXPECT_GT(report_number(report, "baseline_student_test_accuracy"), 0.3);
  // Trained here for want of a checkpoint, and saved where the checkpoint was expected.
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/latest")) << r.output;
  const auto j = nlohmann::json::parse(read_text(report));
  EXPECT_TRUE(j["teachers"][0]["trained"].get<bool>());

  // The second run loads the saved teacher instead of training it again: same accuracy.
  CommandResult again = run_hpm("distill " + cfg + " --report " + dir / "again.json" +
                                " --set distill.baseline=false");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("loaded from"), std::string::npos) << again.output;
  const auto j2 = nlohmann::json::parse(read_text(dir / "again.json"));
  EXPECT_FALSE(j2["teachers"][0]["trained"].get<bool>());
  EXPECT_FALSE(j2.contains("baseline_student_test_accuracy"));
  EXPECT_DOUBLE_EQ(j2["teacher_test_accuracy"].get<double>(),
                   j["teacher_test_accuracy"].get<double>());
  // Same seed, same teacher, same loss: the same student.
  EXPECT_DOUBLE_EQ(j2["student_test_accuracy"].get<double>(),
                   j["student_test_accuracy"].get<double>());
  // [memory] recompute is applied to the student (it was ignored) and, with a teacher's
  // targets in the loss, changes no number.
  CommandResult recomputed = run_hpm("distill " + cfg + " --report " + dir / "recompute.json" +
                                     " --set distill.baseline=false --set memory.recompute=always");
  ASSERT_EQ(recomputed.code, 0) << recomputed.output;
  EXPECT_EQ(nlohmann::json::parse(read_text(dir / "recompute.json"))["student_test_loss"],
            j2["student_test_loss"]);
}

TEST(DistillCommand, TwoTeachersWithWeights) {
  TempDir dir, teacher_dir, other_teacher_dir;
  write_synthetic_mnist(dir.path(), 300, 100);
  const std::string teacher = small_mlp_config(teacher_dir, dir.path());
  const std::string other = small_mlp_config(other_teacher_dir, dir.path(), "seed = 5\n");
  const std::string cfg =
      student_config(dir, dir.path(),
                     "teachers = [{ config = \"" + teacher + "\", weight = 2.0 }, { config = \"" +
                         other + "\", checkpoint = \"" + dir / "t1" + "\" }]\nm_on_m = true\n");
  CommandResult r = run_hpm("distill " + cfg + " --report " + dir / "report.json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(read_text(dir / "report.json"));
  ASSERT_EQ(j["teachers"].size(), 2u);
  EXPECT_EQ(j["teachers"][0]["weight"].get<double>(), 2.0);
  EXPECT_GT(j["student_test_accuracy"].get<double>(), 0.5);
  EXPECT_TRUE(std::filesystem::exists(dir / "t1" + "/latest"));
  // M on M: a student per teacher and their ensemble.
  EXPECT_EQ(j["m_on_m_student_test_accuracies"].size(), 2u);
  EXPECT_GT(j["m_on_m_test_accuracy"].get<double>(), 0.5);
  // No augmentation: from the second epoch on most rows come from the teacher cache.
  EXPECT_TRUE(j["teacher_cache"].get<bool>());
  EXPECT_GT(j["teacher_cache_hits"].get<double>(), 0.0);
  EXPECT_LE(j["teacher_cache_misses"].get<double>(), 300.0);
}

TEST(DistillCommand, ConfigErrorsNameTheKey) {
  TempDir dir, teacher_dir;
  write_synthetic_mnist(dir.path(), 50, 20);
  const std::string teacher = small_mlp_config(teacher_dir, dir.path());
  struct Case {
    std::string section, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"teacher_config = \"" + teacher + "\"\nalpha = 1.5\n", "alpha must be in [0, 1]"},
           {"teacher_config = \"" + teacher + "\"\ntemprature = 2.0\n",
            "unknown key 'temprature' in [distill]"},
           {"teacher_config = \"" + teacher + "\"\ntemperature = \"hot\"\n",
            "[distill] temperature must be a number"},
           {"teachers = [{ config = \"" + teacher + "\", wieght = 1.0 }]\n",
            "unknown key 'wieght' in [distill] teachers"},
           {"teachers = [{ checkpoint = \"x\" }]\n", "each needs 'config'"},
           {"teacher_config = \"" + teacher + "\"\nm_on_m = \"yes\"\n",
            "[distill] m_on_m must be a boolean"},
           {"alpha = 0.5\n", "needs a [distill] section with teacher_config"},
       }) {
    const std::string cfg = student_config(dir, dir.path(), c.section);
    CommandResult r = run_hpm("distill " + cfg);
    EXPECT_EQ(r.code, 1) << c.section << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.section << r.output;
    EXPECT_NE(r.output.find("student.toml"), std::string::npos) << r.output;
  }
  // A teacher config that does not exist is named.
  const std::string missing = student_config(dir, dir.path(), "teacher_config = \"nope.toml\"\n");
  CommandResult r = run_hpm("distill " + missing);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("nope.toml"), std::string::npos) << r.output;
}

// Settings that hpm distill (or its Noisy Student rounds) cannot honour are refused before any
// work, naming the key and where it was given.
TEST(DistillCommand, SettingsItCannotHonourAreRefusedWithTheirPlace) {
  TempDir dir, teacher_dir;
  write_synthetic_mnist(dir.path(), 50, 20);
  const std::string teacher = small_mlp_config(teacher_dir, dir.path());
  const std::string cfg = student_config(dir, dir.path(), "teacher_config = \"" + teacher + "\"\n");
  const std::string noisy = " --set noisy_student.rounds=1";
  struct Case {
    std::string sets, expect;
  };
  for (const Case& c : std::vector<Case>{
           {" --set train.backup_dir=" + dir / "b",
            "--set train.backup_dir=" + dir / "b" +
                ": [train] backup_dir is not supported by hpm distill"},
           {" --set train.best_checkpoint_dir=" + dir / "best",
            "--set train.best_checkpoint_dir=" + dir / "best" +
                ": [train] best_checkpoint_dir is not applied by hpm distill"},
           {" --set memory.device_budget_mb=64",
            "--set memory.device_budget_mb=64: [memory] device_budget_mb is not applied by hpm "
            "distill"},
           {noisy + " --set train.clip_grad_norm=1.0",
            "--set train.clip_grad_norm=1.0: [train] clip_grad_norm does not reach Noisy Student"},
           {noisy + " --set train.label_smoothing=0.1",
            "--set train.label_smoothing=0.1: [train] label_smoothing does not reach Noisy "
            "Student"},
           {noisy + " --set memory.recompute=always",
            "--set memory.recompute=always: [memory] recompute does not reach Noisy Student"},
           {noisy + " --set train.tensorboard_dir=" + dir / "tb",
            "--set train.tensorboard_dir=" + dir / "tb" +
                ": [train] tensorboard_dir does not reach Noisy Student"},
       }) {
    const CommandResult r = run_hpm("distill " + cfg + c.sets);
    EXPECT_EQ(r.code, 1) << c.sets << r.output;
    EXPECT_NE(r.output.find("hpm: error: " + c.expect), std::string::npos) << c.sets << r.output;
  }
  // In the file: its line.
  std::ofstream(teacher, std::ios::app) << "label_smoothing = 0.1\n";
  const std::string noisy_cfg =
      small_mlp_config(dir, dir.path(), "[noisy_student]\nteacher_config = \"" + teacher + "\"\n");
  const CommandResult r = run_hpm("distill " + noisy_cfg);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(teacher + ":12:19: [train] label_smoothing does not reach Noisy Student"),
            std::string::npos)
      << r.output;
}

TEST(ChurnCommand, CheckpointAgainstItselfIsZeroAndAgainstAnotherIsNot) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 300, 200);
  const std::string cfg = small_mlp_config(dir, dir.path());
  ASSERT_EQ(run_hpm("train " + cfg + " --set train.checkpoint_dir=" + dir / "a").code, 0);
  CommandResult r = run_hpm("churn " + dir / "a" + " " + dir / "a" + " " + cfg + " --report " +
                            dir / "self.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(report_number(dir / "self.json", "churn"), 0.0);
  EXPECT_EQ(report_number(dir / "self.json", "good_churn"), 0.0);
  EXPECT_EQ(report_number(dir / "self.json", "bad_churn"), 0.0);
  EXPECT_EQ(report_number(dir / "self.json", "examples"), 200.0);

  // A one-epoch model of another seed: some disagreement, good + bad <= churn.
  ASSERT_EQ(run_hpm("train " + cfg +
                    " --seed 9 --set train.epochs=1 --set train.checkpoint_dir=" + dir / "b")
                .code,
            0);
  r = run_hpm("churn " + dir / "a" + " " + dir / "b" + " " + cfg + " --report " + dir / "ab.json");
  ASSERT_EQ(r.code, 0) << r.output;
  const double churn = report_number(dir / "ab.json", "churn");
  EXPECT_LE(
      report_number(dir / "ab.json", "good_churn") + report_number(dir / "ab.json", "bad_churn"),
      churn + 1e-12);
  EXPECT_NE(r.output.find("good"), std::string::npos);

  CommandResult bad = run_hpm("churn " + dir / "a" + " " + dir / "nothing" + " " + cfg);
  EXPECT_EQ(bad.code, 1) << bad.output;
}

}  // namespace
}  // namespace hpm
