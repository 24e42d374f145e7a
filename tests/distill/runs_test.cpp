// The runs of hpm distill and hpm codistill as library calls (distill_run.h, noisy_student_run.h,
// codistill_run.h), called directly from a Config: what each returns, what it tells its log, and
// what it refuses. The command tests keep what is the command line's (flags, exit codes).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/hpm_cli.h"
#include "common/temp_dir.h"
#include "hpm/distill/codistill_run.h"
#include "hpm/distill/distill_run.h"
#include "hpm/distill/noisy_student_run.h"

namespace hpm::distill {
namespace {

using testing::TempDir;

// A log that keeps its lines, and says whether one of them holds `text`.
struct Lines {
  std::vector<std::string> lines;
  config::RunLog log() {
    return [this](const std::string& line) { lines.push_back(line); };
  }
  bool has(const std::string& text) const {
    for (const auto& l : lines)
      if (l.find(text) != std::string::npos) return true;
    return false;
  }
};

// A student smaller than small_mlp_config's model (the teacher), with `distill` as its section.
config::Config student(const TempDir& dir, const std::string& distill) {
  const std::string teacher = testing::small_mlp_config(dir, dir.path());
  const std::string path = dir / "student.toml";
  std::ofstream(path)
      << "[model]\nlayers = [{ type = \"flatten\" }, { type = \"linear\", in = 784, "
         "out = 8 }, { type = \"relu\" }, { type = \"linear\", in = 8, out = 10 }]\n"
      << "[data]\ndir = \"" << dir.path() << "\"\nbatch_size = 16\n"
      << "[optimizer]\nkind = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
      << "[train]\nepochs = 2\n"
      << "[distill]\nteacher_config = \"" << teacher << "\"\n"
      << distill;
  return config::load_config(path);
}

TEST(DistillationRun, TrainsAMissingTeacherSavesItAndLoadsItTheNextTime) {
  TempDir dir;
  testing::write_synthetic_mnist(dir.path(), 320, 100);
  const config::Config cfg =
      student(dir, "teacher_checkpoint = \"" + dir / "teacher" + "\"\nbaseline = true\n");
  Lines first;
  const DistillationOutcome a = run_distillation(cfg, first.log());
  ASSERT_EQ(a.teachers.size(), 1u);
  EXPECT_TRUE(a.teachers[0].trained);
  EXPECT_TRUE(std::filesystem::exists(dir / "teacher/latest")) << "saved where it was expected";
  EXPECT_TRUE(first.has("teacher 0: saved to")) << first.lines.size();
  EXPECT_GT(a.ensemble.accuracy, 0.5);
  EXPECT_GT(a.student_score.accuracy, 0.5);
  EXPECT_EQ(a.student_score.parameters, a.student->num_parameters());
  EXPECT_TRUE(a.cache_targets) << "no augmentation: the teacher's targets are cached";
  EXPECT_GT(a.cache_hits, 0);
  ASSERT_TRUE(a.baseline.has_value());
  ASSERT_TRUE(a.baseline_to_student.has_value());
  EXPECT_EQ(a.baseline_to_student->examples, 100);
  EXPECT_FALSE(a.m_on_m_accuracy.has_value());
  const nlohmann::json report = distillation_report(cfg, a);
  EXPECT_EQ(report["student_test_accuracy"], a.student_score.accuracy);
  EXPECT_EQ(report["baseline_to_student_churn"]["examples"], 100);

  // The second run loads the teacher it saved: the same teacher, the same student; told nothing.
  config::Config again = cfg;
  again.distill.baseline = false;
  const DistillationOutcome b = run_distillation(again, nullptr);
  EXPECT_FALSE(b.teachers[0].trained);
  EXPECT_EQ(b.ensemble.accuracy, a.ensemble.accuracy);
  EXPECT_EQ(b.student_score.loss, a.student_score.loss);
  EXPECT_FALSE(b.baseline.has_value());
  EXPECT_FALSE(distillation_report(again, b).contains("baseline_student_test_accuracy"));
}

TEST(DistillationRun, RefusesWhatItCannotHonourBeforeAnyWork) {
  TempDir dir;
  testing::write_synthetic_mnist(dir.path(), 32, 16);
  config::Config cfg = student(dir, "");
  cfg.device = "cuda";
  try {
    run_distillation(cfg, nullptr);
    FAIL() << "a student on cuda was accepted";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device"), std::string::npos) << e.what();
  }
  cfg.device = "cpu";
  // A classifier teacher runs on the student's inputs: trained without normalize, it was given
  // normalized ones (soft targets and accuracy of inputs it never saw).
  config::Config normalized = cfg;
  data::AugmentOp normalize;
  normalize.op = "normalize";
  normalize.mean = {0.5f};
  normalize.std = {0.25f};
  normalized.augment = {normalize};
  try {
    run_distillation(normalized, nullptr);
    FAIL() << "a teacher of other preprocessing was accepted";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "was trained on inputs preprocessed by nothing (no normalize or resize), the "
                  "student"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("by normalize(mean [0.5], std [0.25])"), std::string::npos)
        << e.what();
  }
  cfg.distill.teachers.clear();
  EXPECT_THROW(run_distillation(cfg, nullptr), config::ConfigError);
  EXPECT_FALSE(std::filesystem::exists(dir / "teacher")) << "nothing trained, nothing written";
}

TEST(NoisyStudentRun, SplitsTheRowsAndEachRoundsStudentTeachesTheNext) {
  TempDir dir;
  testing::write_synthetic_mnist(dir.path(), 300, 100);
  const config::Config cfg = config::load_config(testing::small_mlp_config(
      dir, dir.path(),
      "[noisy_student]\nrounds = 2\nlabelled = 80\nteacher_epochs = 8\n"
      // The synthetic images encode the label in pixel columns: a shift or flip would change it.
      "crop_padding = 0\nflip = false\n"));
  Lines lines;
  const NoisyStudentOutcome o = run_noisy_student(cfg, lines.log());
  EXPECT_EQ(o.labelled, 80);
  EXPECT_EQ(o.unlabelled, 220);
  EXPECT_EQ(o.teacher_epochs, 8);
  EXPECT_GT(o.teacher_accuracy, 0.5);
  ASSERT_EQ(o.rounds.size(), 2u);
  EXPECT_EQ(o.rounds[1].teacher, o.rounds[0].student) << "round 1's student teaches round 2";
  EXPECT_GT(o.rounds[1].test_accuracy, 0.5);
  EXPECT_TRUE(lines.has("round 2: "));
  const nlohmann::json report = noisy_student_report(cfg, o);
  EXPECT_EQ(report["student_test_accuracy"], o.rounds[1].test_accuracy);
  EXPECT_EQ(report["rounds"].size(), 2u);

  config::Config all_labelled = cfg;
  all_labelled.noisy_student.labelled = 300;
  EXPECT_THROW(run_noisy_student(all_labelled, nullptr), config::ConfigError);
  // Ignored without a word before: augment (the test set went through its normalize, training
  // did not), a per-step schedule (run per epoch), the device (the CPU trained).
  for (const char* set : {"data.augment=[{ op = \"normalize\", mean = 0.5, std = 0.25 }]",
                          "schedule.unit=\"step\"", "train.device=\"cuda\""}) {
    const config::Config refused = config::load_config(cfg.path, {set});
    try {
      run_noisy_student(refused, nullptr);
      ADD_FAILURE() << set << " was accepted";
    } catch (const config::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--set " + std::string(set) + ": "), std::string::npos)
          << e.what();
    }
  }
}

TEST(CodistillationRun, CopiesOnThreadsAreScoredFromTheirGatheredLogits) {
  TempDir dir;
  testing::write_synthetic_mnist(dir.path(), 322, 100);
  const config::Config cfg = config::load_config(testing::small_mlp_config(
      dir, dir.path(),
      "[codistill]\ncopies = 2\nexchange_every = 5\nburn_in = 10\nalpha = 0.5\n"
      "shards = \"disjoint\"\n"));
  Lines lines;
  const CodistillOutcome o = run_codistillation(cfg, lines.log());
  EXPECT_TRUE(o.chief);
  EXPECT_EQ(o.copies, 2);
  EXPECT_EQ(o.steps, 20) << "322 rows cut to 2 shards of 160, batch 16, 2 epochs";
  EXPECT_EQ(o.exchanges, 5) << "before step 1, after 5, 10, 15, 20";
  ASSERT_EQ(o.score.accuracy.size(), 2u);
  EXPECT_GT(o.score.accuracy[0], 0.5);
  EXPECT_GT(o.score.accuracy[1], 0.5);
  ASSERT_EQ(o.score.pairs.size(), 1u);
  EXPECT_EQ(o.score.pairs[0].churn.examples, 100);
  EXPECT_TRUE(lines.has("mean churn between copies"));
  EXPECT_EQ(codistillation_report(cfg, o)["mean_churn"], o.score.mean_churn());

  config::Config with_backup = cfg;
  with_backup.backup_dir = dir / "backup";
  EXPECT_THROW(run_codistillation(with_backup, nullptr), config::ConfigError);
  EXPECT_FALSE(std::filesystem::exists(dir / "backup"));
  config::Config on_gpu = cfg;  // it trained on the CPU without a word
  on_gpu.device = "cuda";
  try {
    run_codistillation(on_gpu, nullptr);
    ADD_FAILURE() << "device = cuda was accepted";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[train] device = \"cuda\" is not applied by hpm "
                                         "codistill"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hpm::distill
