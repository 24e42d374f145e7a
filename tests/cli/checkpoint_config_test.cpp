// Checkpoints that describe themselves: a run's checkpoint holds its resolved configuration, so
// `hpm sample --checkpoint DIR` and `hpm evaluate --checkpoint DIR` need nothing else, nor does
// `hpm evaluate --weights` on what `hpm export` wrote from it; a --set or a config file whose
// [model] contradicts theirs is refused naming both values; a checkpoint written before configs
// were recorded asks for its config.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/hpm_cli.h"
#include "common/temp_dir.h"

namespace hpm::testing {
namespace {

std::string corpus(const TempDir& dir) {
  std::filesystem::create_directories(dir / "corpus");
  std::ofstream out(dir / "corpus/a.txt");
  for (int i = 0; i < 40; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  return dir / "corpus/*.txt";
}

std::string checkpoint_gpt_config(const TempDir& dir, const std::string& files, int n_layer = 1) {
  const std::string path = dir / ("gpt" + std::to_string(n_layer) + ".toml");
  std::ofstream(path) << "[model]\nkind = \"gpt\"\nn_layer = " << n_layer
                      << "\nn_head = 2\nn_embd = 16\nblock_size = 8\nvocab_size = 256\n"
                      << "[data]\nsource = \"text\"\nfiles = \"" << files << "\"\nbatch_size = 4\n"
                      << "[optimizer]\nkind = \"adamw\"\nlr = 0.01\n"
                      << "[train]\nmax_steps = 20\neval_every = 10\neval_iters = 3\n"
                      << "checkpoint_dir = \"" << dir / "ckpt"
                      << "\"\n";
  return path;
}

// The last "val loss X" printed by train (its final evaluation) or evaluate.
std::string val_loss(const std::string& output) {
  const auto at = output.rfind("val loss ");
  return at == std::string::npos ? "" : output.substr(at + 9, 6);
}

struct Trained {
  TempDir dir;
  std::string config, ckpt, trained_loss;
  Trained() {
    config = checkpoint_gpt_config(dir, corpus(dir));
    ckpt = dir / "ckpt";
    const CommandResult r = run_hpm("train " + config + " --set model.n_embd=24");
    EXPECT_EQ(r.code, 0) << r.output;
    trained_loss = val_loss(r.output);
  }
};

TEST(SelfDescribingCheckpoint, SampleAndEvaluateNeedNothingElse) {
  Trained t;
  // The run's --set (n_embd = 24) is in the checkpoint too: no config, no --set.
  const CommandResult sample = run_hpm("sample --checkpoint " + t.ckpt + " --tokens 5");
  EXPECT_EQ(sample.code, 0) << sample.output;
  EXPECT_NE(sample.output.find("5 tokens in"), std::string::npos) << sample.output;
  const CommandResult eval = run_hpm("evaluate --checkpoint " + t.ckpt);
  ASSERT_EQ(eval.code, 0) << eval.output;
  EXPECT_FALSE(t.trained_loss.empty());
  EXPECT_EQ(val_loss(eval.output), t.trained_loss) << eval.output;
  // Settings beside the model's may change: more evaluation windows.
  EXPECT_EQ(run_hpm("evaluate --checkpoint " + t.ckpt + " --set train.eval_iters=5").code, 0);
}

// The checkpoint as the only argument: `hpm sample CKPT`, `hpm evaluate CKPT`, and the weights
// `hpm export CKPT` writes as `hpm evaluate FILE.safetensors`.
TEST(SelfDescribingCheckpoint, TheCheckpointAloneAsTheArgument) {
  Trained t;
  const CommandResult sample = run_hpm("sample " + t.ckpt + " --tokens 5 --prompt the");
  EXPECT_EQ(sample.code, 0) << sample.output;
  EXPECT_NE(sample.output.find("5 tokens in"), std::string::npos) << sample.output;
  const CommandResult eval = run_hpm("evaluate " + t.ckpt);
  ASSERT_EQ(eval.code, 0) << eval.output;
  EXPECT_EQ(val_loss(eval.output), t.trained_loss) << eval.output;
  const std::string weights = t.dir / "w.safetensors";
  ASSERT_EQ(run_hpm("export " + t.ckpt + " -o " + weights).code, 0);
  const CommandResult from_weights = run_hpm("evaluate " + weights);
  ASSERT_EQ(from_weights.code, 0) << from_weights.output;
  EXPECT_EQ(val_loss(from_weights.output), t.trained_loss) << from_weights.output;
  const CommandResult nothing = run_hpm("sample --tokens 5");
  EXPECT_NE(nothing.code, 0) << nothing.output;
  EXPECT_NE(nothing.output.find("hpm sample: give the checkpoint to draw from"), std::string::npos)
      << nothing.output;
}

// A run whose [data] paths are relative to where it ran records them absolute: its checkpoint
// reads the same text from any working directory.
TEST(SelfDescribingCheckpoint, RelativeDataPathsResolveFromAnyDirectory) {
  TempDir dir;
  corpus(dir);
  const std::string cfg = checkpoint_gpt_config(dir, "corpus/*.txt");
  const CommandResult r = run_shell("cd " + dir.path() + " && " + hpm_binary() + " train " + cfg);
  ASSERT_EQ(r.code, 0) << r.output;
  std::filesystem::create_directories(dir / "elsewhere");
  const CommandResult eval =
      run_shell("cd " + dir / "elsewhere" + " && " + hpm_binary() + " evaluate " + dir / "ckpt");
  ASSERT_EQ(eval.code, 0) << eval.output;
  EXPECT_EQ(val_loss(eval.output), val_loss(r.output)) << eval.output;
}

TEST(SelfDescribingCheckpoint, ASetContradictingTheCheckpointIsRefusedNamingBoth) {
  Trained t;
  for (const std::string cmd : {"sample", "evaluate"}) {
    const CommandResult r = run_hpm(cmd + " --checkpoint " + t.ckpt + " --set model.n_embd=32");
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("[model] n_embd = 32"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("contradicts the checkpoint"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("n_embd = 24"), std::string::npos) << r.output;
  }
}

TEST(SelfDescribingCheckpoint, AConfigContradictingTheCheckpointIsRefusedNamingBoth) {
  Trained t;
  // The config the run started from, without the run's --set: its n_embd (16) is not the model's.
  const CommandResult r = run_hpm("evaluate " + t.config + " --checkpoint " + t.ckpt);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[model] n_embd = 16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("n_embd = 24"), std::string::npos) << r.output;
  // With the run's --set it agrees, and runs.
  EXPECT_EQ(run_hpm("evaluate " + t.config + " --set model.n_embd=24 --checkpoint " + t.ckpt).code,
            0);
}

TEST(SelfDescribingCheckpoint, ACheckpointWithoutItsConfigAsksForIt) {
  Trained t;
  // As an older hpm wrote it: no config in the state's metadata.
  for (const auto& e : std::filesystem::directory_iterator(t.ckpt)) {
    if (!e.is_directory()) continue;
    const std::string state = e.path().string() + "/trainer_state.json";
    auto j = nlohmann::json::parse(std::ifstream(state));
    j["metadata"].erase("config");
    j["metadata"].erase("config_path");
    std::ofstream(state) << j.dump(2);
  }
  const CommandResult r = run_hpm("sample --checkpoint " + t.ckpt + " --tokens 5");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("does not hold the config it was trained with"), std::string::npos)
      << r.output;
  // Given it, it runs as before.
  EXPECT_EQ(run_hpm("sample " + t.config + " --set model.n_embd=24 --checkpoint " + t.ckpt +
                    " --tokens 5")
                .code,
            0);
}

TEST(SelfDescribingCheckpoint, ExportedWeightsCarryTheConfigToEvaluate) {
  Trained t;
  const std::string weights = t.dir / "model.safetensors";
  ASSERT_EQ(run_hpm("export " + t.ckpt + " -o " + weights).code, 0);
  const CommandResult eval = run_hpm("evaluate --weights " + weights);
  ASSERT_EQ(eval.code, 0) << eval.output;
  EXPECT_EQ(val_loss(eval.output), t.trained_loss) << eval.output;
  const CommandResult wrong = run_hpm("evaluate --weights " + weights + " --set model.n_layer=2");
  EXPECT_NE(wrong.code, 0) << wrong.output;
  EXPECT_NE(wrong.output.find("contradicts the weights file"), std::string::npos) << wrong.output;
  EXPECT_NE(wrong.output.find("n_layer = 1"), std::string::npos) << wrong.output;
}

}  // namespace
}  // namespace hpm::testing
