// `[train] tensorboard_dir`: the event files a run writes, read back by an independent reader
// (tests/cli/tensorboard_reader.py: its own TFRecord framing and CRC-32C, and Debian's
// python3-protobuf decoding `Event` from a descriptor with TensorFlow's field numbers), hold the
// epochs' losses, accuracies, learning rate and throughput that the run reports, under Keras' tags.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/hpm_cli.h"

namespace hpm {
namespace {

using namespace hpm::testing;
using nlohmann::json;

// The only events file in `dir`, decoded by the reader.
json read_events(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  EXPECT_EQ(files.size(), 1u) << dir;
  if (files.empty()) return json();
  EXPECT_EQ(std::filesystem::path(files[0]).filename().string().rfind("events.out.tfevents.", 0),
            0u);
  const CommandResult r = run_shell("/usr/bin/python3 " + std::string(HPM_SOURCE_DIR) +
                                    "/tests/cli/tensorboard_reader.py " + files[0]);
  EXPECT_EQ(r.code, 0) << r.output;
  return json::parse(r.output.substr(r.output.find('{')));
}

// tag -> (step -> value)
std::map<std::string, std::map<std::int64_t, double>> by_tag(const json& events) {
  std::map<std::string, std::map<std::int64_t, double>> out;
  for (const auto& s : events["scalars"]) out[s[1]][s[0].get<std::int64_t>()] = s[2];
  return out;
}

TEST(TensorBoard, EventFilesHoldWhatTheRunReports) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 160, 48);
  const std::string cfg = small_mlp_config(dir, dir.path());
  const std::string tb = dir / "tb";
  CommandResult r = run_hpm("train " + cfg + " --set train.tensorboard_dir='\"" + tb +
                            "\"' --report " + dir / "r.json");
  ASSERT_EQ(r.code, 0) << r.output;
  const json report = json::parse(read_text(dir / "r.json"));
  const json train = read_events(tb + "/train"), validation = read_events(tb + "/validation");
  EXPECT_EQ(train["file_version"], "brain.Event:2");
  EXPECT_EQ(validation["file_version"], "brain.Event:2");
  const auto t = by_tag(train), v = by_tag(validation);
  ASSERT_EQ(report["history"].size(), 2u);
  for (const std::string tag :
       {"epoch_loss", "epoch_accuracy", "epoch_learning_rate", "epoch_samples_per_s"}) {
    ASSERT_TRUE(t.count(tag)) << tag;
    EXPECT_EQ(t.at(tag).size(), 2u) << tag;
  }
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    const json& h = report["history"][static_cast<std::size_t>(epoch)];
    const auto near = [](double a, double b) { return std::abs(a - b) <= 1e-6 * std::abs(b); };
    EXPECT_TRUE(near(t.at("epoch_loss").at(epoch), h["train_loss"])) << epoch;
    EXPECT_TRUE(near(t.at("epoch_accuracy").at(epoch), h["train_accuracy"])) << epoch;
    EXPECT_TRUE(near(t.at("epoch_samples_per_s").at(epoch), h["samples_per_s"])) << epoch;
    EXPECT_NEAR(t.at("epoch_learning_rate").at(epoch), 0.05, 1e-9) << epoch;
    EXPECT_TRUE(near(v.at("epoch_loss").at(epoch), h["test_loss"])) << epoch;
    EXPECT_TRUE(near(v.at("epoch_accuracy").at(epoch), h["test_accuracy"])) << epoch;
  }
  // A second run in the same directory adds files beside the first ones (new pid).
  ASSERT_EQ(run_hpm("train " + cfg + " --set train.tensorboard_dir='\"" + tb + "\"'").code, 0);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tb + "/train"), {}), 2);
}

// A language model trained by steps: both splits carry the same tags (its token accuracy and
// perplexity under one name each), at x = the global step of each evaluation, the last one at
// max_steps though eval_every does not divide it.
TEST(TensorBoard, StepRunsLogTheSameTagsForBothSplitsAtTheirSteps) {
  TempDir dir;
  write_word_files(dir);
  const std::string cfg = dir / "gpt.toml";
  std::ofstream(cfg) << "[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 16\n"
                     << "block_size = 8\nvocab_size = 256\n"
                     << "[data]\nsource = \"text\"\nfiles = \"" << dir / "text*.txt"
                     << "\"\nbatch_size = 4\n[optimizer]\nkind = \"adamw\"\nlr = 0.01\n"
                     << "[train]\nmax_steps = 20\neval_every = 7\neval_iters = 2\n"
                     << "tensorboard_dir = \"" << dir / "tb"
                     << "\"\n";
  const CommandResult r = run_hpm("train " + cfg);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto t = by_tag(read_events(dir / "tb/train"));
  const auto v = by_tag(read_events(dir / "tb/validation"));
  for (const std::string tag : {"epoch_loss", "epoch_token_accuracy", "epoch_perplexity"}) {
    ASSERT_TRUE(t.count(tag)) << tag;
    ASSERT_TRUE(v.count(tag)) << tag;
    for (const auto* split : {&t, &v}) {
      std::vector<std::int64_t> steps;
      for (const auto& [step, value] : split->at(tag)) steps.push_back(step);
      EXPECT_EQ(steps, (std::vector<std::int64_t>{7, 14, 20})) << tag;
    }
  }
  EXPECT_FALSE(v.count("epoch_accuracy")) << "the validation split names it as training does";
}

TEST(TensorBoard, AnUnwritableDirectoryFailsBeforeTraining) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 160, 48);
  const std::string cfg = small_mlp_config(dir, dir.path());
  std::ofstream(dir / "file") << "not a directory";
  CommandResult r =
      run_hpm("train " + cfg + " --set train.tensorboard_dir='\"" + dir / "file" + "/tb\"'");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("tensorboard: cannot create " + dir / "file" + "/tb/train"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("epoch 1/"), std::string::npos) << "trained before failing";
}

}  // namespace
}  // namespace hpm
