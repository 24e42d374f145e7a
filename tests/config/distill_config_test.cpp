// The [noisy_student] and [codistill] sections: the committed examples parse, defaults, and bad
// values are errors that name the file and the key.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "common/temp_dir.h"
#include "hpm/config/config.h"

namespace hpm::config {
namespace {

std::string source(const char* p) { return std::string(HPM_SOURCE_DIR) + "/" + p; }

TEST(DistillConfig, CommittedExamplesParse) {
  const Config ns = load_config(source("examples/fashion_noisy_student.toml"));
  ASSERT_TRUE(ns.noisy_student.present);
  EXPECT_EQ(ns.noisy_student.rounds, 2);
  EXPECT_EQ(ns.noisy_student.labelled, 2000);
  EXPECT_EQ(ns.noisy_student.pseudo_labels, "hard");
  const Config co = load_config(source("examples/fashion_codistill.toml"));
  ASSERT_TRUE(co.codistill.present);
  EXPECT_EQ(co.codistill.copies, 2);
  EXPECT_EQ(co.codistill.exchange_every, 100);
  EXPECT_EQ(co.codistill.burn_in, 500);
  EXPECT_EQ(co.codistill.shards, "identical");
  const Config st = load_config(source("bench/distill/student.toml"));
  ASSERT_EQ(st.distill.teachers.size(), 1u);
  EXPECT_FALSE(st.noisy_student.present);
  EXPECT_FALSE(st.codistill.present);
  // The GPT student and its teacher: the teacher config resolves beside the student's.
  const Config gpt = load_config(source("examples/fortunes_distill.toml"));
  ASSERT_EQ(gpt.distill.teachers.size(), 1u);
  EXPECT_EQ(gpt.strategy, "mirrored");
  EXPECT_EQ(gpt.distill.teachers[0].config, source("examples/fortunes_gpt_teacher.toml"));
  const Config teacher = load_config(gpt.distill.teachers[0].config);
  EXPECT_EQ(teacher.gpt.vocab_size, gpt.gpt.vocab_size);
  EXPECT_GT(teacher.gpt.n_embd, gpt.gpt.n_embd);
}

std::string distill_error_of(const std::string& sections) {
  testing::TempDir dir;
  const std::string path = dir / "c.toml";
  std::ofstream(path) << "[model]\nlayers = [{ type = \"flatten\" }]\n" << sections;
  try {
    load_config(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DistillConfig, BadValuesNameFileLineAndKey) {
  std::string e = distill_error_of("[codistill]\ncopies = 2\nshards = \"halves\"\n");
  EXPECT_NE(e.find("c.toml:5:"), std::string::npos) << e;
  EXPECT_NE(e.find("[codistill] shards"), std::string::npos) << e;
  e = distill_error_of("[codistill]\nexchange_every = 0\n");
  EXPECT_NE(e.find("exchange_every"), std::string::npos) << e;
  e = distill_error_of("[codistill]\nalpha = 2.0\n");
  EXPECT_NE(e.find("[codistill] alpha"), std::string::npos) << e;
  e = distill_error_of("[noisy_student]\nconfidence_threshold = 1.5\n");
  EXPECT_NE(e.find("c.toml:4:"), std::string::npos) << e;
  EXPECT_NE(e.find("confidence_threshold"), std::string::npos) << e;
  e = distill_error_of("[noisy_student]\nlabelled_fraction = 1.0\n");
  EXPECT_NE(e.find("labelled_fraction"), std::string::npos) << e;
  e = distill_error_of("[noisy_student]\nround = 2\n");
  EXPECT_NE(e.find("unknown key 'round'"), std::string::npos) << e;
  EXPECT_EQ(distill_error_of("[noisy_student]\n[codistill]\n"), "");
}

}  // namespace
}  // namespace hpm::config
