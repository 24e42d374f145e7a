// [memory] and [train] accumulation_steps: the config's checks, and end to end, a model whose
// training step exceeds the device budget fails naming its need and the budget, and trains under
// the same budget with recomputation or with offload (and with accumulation).
#include <gtest/gtest.h>

#include <fstream>

#include "common/hpm_cli.h"
#include "common/temp_dir.h"
#include "hpm/cli/run_config.h"

namespace hpm::cli {
namespace {

using hpm::testing::run_hpm;
using hpm::testing::TempDir;

const char* kModel = R"([model]
layers = [{ type = "flatten" }, { type = "linear", in = 784, out = 10 }]
)";

std::string config_error(const std::string& extra) {
  TempDir dir;
  const std::string path = dir / "run.toml";
  std::ofstream(path) << kModel << extra;
  try {
    load_config(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for:\n" << extra;
  return "";
}

TEST(MemoryConfig, ReadsTheSection) {
  TempDir dir;
  const std::string path = dir / "run.toml";
  std::ofstream(path) << kModel
                      << "[train]\naccumulation_steps = 4\n[memory]\nrecompute = \"except_last\"\n"
                         "recompute_every = 2\noffload_threshold_kb = 8\ndevice_budget_mb = 12.5\n";
  const Config c = load_config(path);
  EXPECT_EQ(c.accumulation_steps, 4);
  EXPECT_EQ(c.recompute, "except_last");
  EXPECT_EQ(c.recompute_every, 2);
  EXPECT_EQ(c.offload_threshold_kb, 8);
  EXPECT_EQ(c.device_budget_mb, 12.5);
  EXPECT_EQ(fit_options(c).accumulation_steps, 4);
}

// A model of blocks wrapped for recomputation or offload keeps the plain model's parameter and
// buffer names, so a checkpoint of either loads into the other (hpm evaluate builds it plain).
TEST(MemoryConfig, WrappedModelsOfBlocksKeepTheirNames) {
  TempDir dir;
  const std::string path = dir / "run.toml";
  std::ofstream(path) << "[model]\nkind = \"resnet\"\nwidths = [4, 8]\nblocks = [1, 1]\n";
  for (const char* memory : {"memory.recompute=always", "memory.offload=true"}) {
    const Config c = load_config(path, {memory});
    auto plain = build_model(c), wrapped = with_memory_options(c, build_model(c));
    const auto a = plain->state_dict(), b = wrapped->state_dict();
    ASSERT_EQ(a.size(), b.size()) << memory;
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].first, b[i].first) << memory;
    EXPECT_NO_THROW(wrapped->load_state_dict(a)) << memory;
    EXPECT_EQ(wrapped->type_name(), "ResNet");
  }
}

TEST(MemoryConfig, EveryDocumentedErrorIsReported) {
  EXPECT_NE(config_error("[memory]\nrecompute = \"sometimes\"\n")
                .find("recompute mode \"sometimes\" is not one of never, always, except_last"),
            std::string::npos);
  EXPECT_NE(config_error("[memory]\nrecompute = \"always\"\noffload = true\n").find("choose one"),
            std::string::npos);
  EXPECT_NE(config_error("[memory]\nrecompute_every = 0\n").find("recompute_every must be"),
            std::string::npos);
  EXPECT_NE(config_error("[memory]\ndevice_budget_mb = -1\n").find("device_budget_mb must be"),
            std::string::npos);
  EXPECT_NE(config_error("[memory]\noffload_threshold_kb = -1\n").find("offload_threshold_kb"),
            std::string::npos);
  EXPECT_NE(config_error("[memory]\nswap = true\n").find("unknown key 'swap' in [memory]"),
            std::string::npos);
  EXPECT_NE(config_error("[train]\naccumulation_steps = 0\n").find("accumulation_steps must be"),
            std::string::npos);
}

// A deep mlp whose activations (batch 256) outweigh its parameters.
std::string deep_config(const TempDir& dir, const std::string& data, const std::string& memory,
                        const std::string& train = "") {
  const std::string path = dir / "deep.toml";
  std::ofstream out(path);
  out << "[model]\nlayers = [{ type = \"flatten\" }, { type = \"linear\", in = 784, out = 128 }";
  for (int i = 0; i < 6; ++i)
    out << ", { type = \"relu\" }, { type = \"linear\", in = 128, out = 128 }";
  out << ", { type = \"relu\" }, { type = \"linear\", in = 128, out = 10 }]\n"
      << "[data]\ndir = \"" << data << "\"\nbatch_size = 256\n"
      << "[optimizer]\nkind = \"sgd\"\nlr = 0.05\n[train]\nepochs = 1\n"
      << train << "[memory]\n"
      << memory;
  return path;
}

// Out of memory exits 6 (not 3, a non-finite loss): a launcher does not restart either.
TEST(MemoryCommand, OverBudgetFailsClearlyAndFitsWithRecomputationOrOffload) {
  TempDir dir;
  hpm::testing::write_synthetic_mnist(dir.path(), 512, 64);
  // The budget sits between the plain step's need and the others' (measured by the error message
  // itself under a 4 MiB budget: plain 5.3 MiB, recompute every 2 4.7, offload 4.2, accumulation
  // over 4 micro-batches 4.5; 2.5 MiB of it are the data set and parameters).
  const std::string budget = "device_budget_mb = 5\n";
  const auto plain = run_hpm("train " + deep_config(dir, dir.path(), budget));
  EXPECT_EQ(plain.code, 6) << plain.output;
  EXPECT_NE(plain.output.find("the training step needs "), std::string::npos) << plain.output;
  EXPECT_NE(plain.output.find("device 'cpu' has a budget of 5.0 MiB"), std::string::npos)
      << plain.output;
  EXPECT_NE(plain.output.find("try [memory] recompute, offload or [pipeline] stages"),
            std::string::npos)
      << plain.output;

  for (const auto& [memory, train] :
       {std::pair<std::string, std::string>{"recompute = \"always\"\nrecompute_every = 2\n", ""},
        {"offload = true\noffload_threshold_kb = 16\n", ""},
        {"", "accumulation_steps = 4\n"}}) {
    const auto r = run_hpm("train " + deep_config(dir, dir.path(), budget + memory, train));
    EXPECT_EQ(r.code, 0) << memory << train << r.output;
    EXPECT_NE(r.output.find("test accuracy"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace hpm::cli
