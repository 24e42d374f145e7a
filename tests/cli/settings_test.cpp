// Command-line settings a user gets wrong: a seed or another number out of range says the range
// in a few words; more threads than CPUs is said, naming both numbers.
#include <gtest/gtest.h>

#include "common/hpm_cli.h"

namespace hpm::testing {
namespace {

TEST(Settings, ASeedOutOfRangeNamesTheRange) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 32, 16);
  const std::string config = small_mlp_config(dir, dir.path(), "");
  for (const std::string seed : {"-1", "x", "99999999999999999999"}) {
    const CommandResult r = run_hpm("train " + config + " --seed " + seed);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("--seed: a seed is an integer in 0..2^63-1 (9223372036854775807), "
                            "got " +
                            seed),
              std::string::npos)
        << r.output;
    EXPECT_LT(r.output.size(), 400u) << r.output;
  }
  EXPECT_EQ(run_hpm("train " + config + " --seed 9223372036854775807 --set train.epochs=1").code,
            0);
}

// A number option out of range says so in a few words (CLI11's own check quotes the largest
// double, 309 digits, and lets NaN through).
TEST(Settings, ANumberOutOfRangeIsShortAndNaNIsRefused) {
  TempDir dir;
  for (const std::string value : {"nan", "0", "-1", "inf", "x"}) {
    const CommandResult r = run_hpm("sample " + dir / "none.toml" + " --checkpoint " +
                                    dir / "none" + " --temperature " + value);
    EXPECT_EQ(r.code, 2) << value << r.output;
    EXPECT_NE(r.output.find("--temperature: expected a number > 0, got " + value),
              std::string::npos)
        << r.output;
    EXPECT_LT(r.output.size(), 400u) << r.output;
  }
  const CommandResult r = run_hpm("train " + dir / "none.toml" + " --rank -1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--rank: expected a number >= 0, got -1"), std::string::npos) << r.output;
  EXPECT_LT(r.output.size(), 400u) << r.output;
}

TEST(Settings, MoreThreadsThanCpusIsSaid) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 32, 16);
  const std::string config = small_mlp_config(dir, dir.path(), "");
  // One CPU for the process (sched_getaffinity), three threads.
  const CommandResult r = run_shell("taskset -c 0 " + hpm_binary() + " train " + config +
                                    " --set train.epochs=1 " + "--set train.threads=3");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("hpm: warning: 3 threads on 1 available CPU(s): threads beyond the "
                          "CPUs wait for one another and run slower; set [train] threads (or "
                          "--threads) to at most 1"),
            std::string::npos)
      << r.output;
  const CommandResult fine =
      run_shell("taskset -c 0 " + hpm_binary() + " train " + config + " --set train.epochs=1");
  EXPECT_EQ(fine.output.find("warning"), std::string::npos) << fine.output;
}

}  // namespace
}  // namespace hpm::testing
