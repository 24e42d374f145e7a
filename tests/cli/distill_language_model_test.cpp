// `hpm distill` on language models: a byte-level GPT student learns from a larger GPT teacher's
// next-token distributions, on one device and under data-parallel strategies (Mirrored's threads
// and MultiWorkerMirrored's processes), which equal one device; alpha 0 is the student trained
// alone; teachers that cannot teach the student are named.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/hpm_cli.h"

namespace hpm {
namespace {

using namespace hpm::testing;

std::string distill_gpt_config(const TempDir& dir, const std::string& name,
                               const std::string& model, const std::string& rest) {
  const std::string path = dir / name;
  std::ofstream(path) << "[model]\nkind = \"gpt\"\nvocab_size = 256\ndropout = 0.0\n"
                      << model << "[data]\nsource = \"text\"\nfiles = \"" << dir.path()
                      << "/*.txt\"\nbatch_size = 4\n"
                         "[optimizer]\nkind = \"adamw\"\nlr = 3e-3\n"
                         "[train]\neval_every = 10\neval_iters = 4\nseed = 3\n"
                      << rest;
  return path;
}

nlohmann::json run_report(const std::string& command, const std::string& report) {
  const CommandResult r = run_shell(command + " --report " + report);
  EXPECT_EQ(r.code, 0) << command << "\n" << r.output;
  return nlohmann::json::parse(read_text(report));
}

TEST(DistillLanguageModel, GptStudentUnderMirroredAndProcessesEqualsOneDevice) {
  TempDir dir;
  write_word_files(dir);
  const std::string teacher = distill_gpt_config(
      dir, "teacher.toml", "n_layer = 2\nn_head = 2\nn_embd = 48\nblock_size = 16\n",
      "max_steps = 100\n");
  const std::string student = distill_gpt_config(
      dir, "student.toml", "n_layer = 1\nn_head = 2\nn_embd = 32\nblock_size = 16\n",
      "max_steps = 100\nmetrics_csv = \"" + dir / "m.csv" + "\"\n[distill]\nteacher_config = \"" +
          teacher + "\"\nteacher_checkpoint = \"" + dir / "teacher_ckpt" +
          "\"\nalpha = 0.5\ntemperature = 2.0\nbaseline = true\n");
  const std::string hpm = hpm_binary();
  const std::string lr = " --set optimizer.lr=1e-2";  // the student's: it learns more than spaces

  // One device: the teacher is trained here (no checkpoint yet) and saved.
  const auto one = run_report(hpm + " distill " + student + lr, dir / "one.json");
  EXPECT_TRUE(one["language_model"].get<bool>());
  EXPECT_TRUE(one["teachers"][0]["trained"].get<bool>());
  EXPECT_TRUE(std::filesystem::exists(dir / "teacher_ckpt/latest"));
  EXPECT_GT(one["teachers"][0]["parameters"].get<double>(),
            one["student_parameters"].get<double>());
  const double distilled = one["student_test_loss"].get<double>();
  const double alone = one["baseline_student_test_loss"].get<double>();
  EXPECT_TRUE(distilled > 0.5 && distilled < std::log(256.0)) << distilled;
  EXPECT_TRUE(alone > 0.5 && alone < std::log(256.0)) << alone;
  EXPECT_NE(distilled, alone);
  EXPECT_GT(one["teacher_test_accuracy"].get<double>(), 0.0);
  const double churn = one["baseline_to_student_churn"]["churn"].get<double>();
  EXPECT_TRUE(churn > 0.0 && churn <= 1.0) << churn;
  // 4 validation windows of 16 positions: churn is over next-token predictions.
  EXPECT_EQ(one["baseline_to_student_churn"]["examples"].get<int>(), 4 * 4 * 16);
  // The distilled run's and the baseline's metrics: an evaluation every 10 of 100 steps each.
  for (const char* csv : {"m.csv", "m-baseline.csv"}) {
    std::ifstream in(dir / csv);
    std::string header, row;
    ASSERT_TRUE(std::getline(in, header)) << csv;
    EXPECT_NE(header.find("test_loss"), std::string::npos) << header;
    int rows = 0;
    while (std::getline(in, row)) ++rows;
    EXPECT_EQ(rows, 10) << csv;
  }

  // alpha 0: the distiller steps aside and the student is the baseline, bit for bit.
  const auto labels_only = run_report(
      hpm + " distill " + student + lr + " --set distill.alpha=0 --set distill.baseline=false",
      dir / "alpha0.json");
  EXPECT_FALSE(labels_only["teachers"][0]["trained"].get<bool>());  // loaded this time
  EXPECT_EQ(labels_only["student_test_loss"].get<double>(), alone);

  // Data parallel equals one device up to float reassociation, over steps few enough that a
  // plateau's escape (chaotic in the last bits) does not amplify it: Mirrored's 2 replicas of 2
  // rows each as threads, and MultiWorkerMirrored over two processes (gloo), each loading the
  // teacher from its checkpoint.
  const std::string short_run = lr + " --set train.max_steps=20 --set distill.baseline=false";
  const double reference =
      run_report(hpm + " distill " + student + short_run, dir / "short.json")["student_test_loss"]
          .get<double>();
  const auto mirrored =
      run_report(hpm + " distill " + student + short_run +
                     " --set strategy.kind='\"mirrored\"' --set strategy.replicas=2",
                 dir / "mirrored.json");
  EXPECT_EQ(mirrored["strategy"], "mirrored");
  EXPECT_NEAR(mirrored["student_test_loss"].get<double>(), reference, 1e-5);
  const auto processes =
      run_report(hpm + " launch -n 2 -- " + hpm + " distill " + student + short_run +
                     " --set strategy.kind='\"multi_worker_mirrored\"'",
                 dir / "processes.json");
  EXPECT_EQ(processes["strategy"], "multi_worker_mirrored");
  EXPECT_NEAR(processes["student_test_loss"].get<double>(), reference, 1e-5);
  // With the baseline (the examples' default) the processes train a second model after the
  // student, in the same process group: it used to meet the first rendezvous' store and fail
  // ("Connection refused") or hang.
  const auto with_baseline =
      run_report(hpm + " launch -n 2 -- " + hpm + " distill " + student + lr +
                     " --set train.max_steps=20 --set distill.baseline=true"
                     " --set strategy.kind='\"multi_worker_mirrored\"'",
                 dir / "processes_baseline.json");
  EXPECT_NEAR(with_baseline["student_test_loss"].get<double>(), reference, 1e-5);
  EXPECT_TRUE(with_baseline.contains("baseline_student_test_loss")) << with_baseline.dump();
  EXPECT_NE(reference, distilled);  // 20 steps, not 100
}

TEST(DistillLanguageModel, TeachersThatCannotTeachTheStudentAreNamed) {
  TempDir dir;
  write_word_files(dir);
  const auto student_with = [&](const std::string& teacher) {
    return distill_gpt_config(dir, "student.toml",
                              "n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\n",
                              "max_steps = 10\n[distill]\nteacher_config = \"" + teacher + "\"\n");
  };
  struct Case {
    std::string teacher, expect;
  };
  const std::string small_vocab = distill_gpt_config(
      dir, "t_vocab.toml", "n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\n",
      "max_steps = 10\n");
  const std::vector<Case> cases = {
      {distill_gpt_config(dir, "t_block.toml",
                          "n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 8\n",
                          "max_steps = 10\n"),
       "has block_size 8, shorter than the student's 16"},
      {small_mlp_config(dir, dir.path()), "a language model learns from language models"},
  };
  for (const Case& c : cases) {
    const CommandResult r = run_hpm("distill " + student_with(c.teacher));
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("teacher " + c.teacher), std::string::npos) << r.output;
  }
  // A teacher of another vocabulary (its own config's vocab_size) is named with both sizes.
  const CommandResult vocab =
      run_hpm("distill " + student_with(small_vocab) + " --set model.vocab_size=300");
  EXPECT_EQ(vocab.code, 1) << vocab.output;
  EXPECT_NE(vocab.output.find("has vocab_size 256, the student 300"), std::string::npos)
      << vocab.output;

  // Under several workers a teacher without a checkpoint is not trained by each of them.
  const std::string hpm = hpm_binary();
  const CommandResult workers =
      run_shell(hpm + " launch -n 2 -- " + hpm + " distill " + student_with(small_vocab) +
                " --set strategy.kind='\"multi_worker_mirrored\"'");
  EXPECT_NE(workers.code, 0);
  EXPECT_NE(workers.output.find("must be trained first"), std::string::npos) << workers.output;
}

}  // namespace
}  // namespace hpm
