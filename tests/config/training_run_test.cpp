// The config layer's entry points, called directly (no command line): a configuration's training
// run as hpm train assembles it, the model read back from the checkpoint it wrote, and the
// description a checkpoint records.
#include "hpm/config/training_run.h"

#include <gtest/gtest.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/hpm_cli.h"
#include "common/temp_dir.h"
#include "hpm/config/datasets.h"

namespace hpm::config {
namespace {

using hpm::testing::TempDir;

std::vector<float> flat(const nn::Module& m) {
  std::vector<float> out;
  for (const auto& [name, t] : m.state_dict()) {
    if (t.dtype() != DType::F32) continue;
    const std::vector<float> v = t.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// An mlp by steps (25 steps, evaluated every 10) on 160 synthetic images: the run trains to its
// budget, and the model load_trained_model reads back from the checkpoint is the trained one.
TEST(TrainingRun, AConfigsRunTrainsAndItsCheckpointLoadsBack) {
  TempDir dir;
  hpm::testing::write_synthetic_mnist(dir.path(), 160, 48);
  const std::string path = hpm::testing::small_mlp_config(dir, dir.path());
  Config cfg = load_config(path, {"train.max_steps=25", "train.eval_every=10",
                                  "train.checkpoint_dir=\"" + dir / "ckpt" + "\""});
  TrainingRun run = make_training_run(cfg);
  EXPECT_EQ(run.strategy, nullptr);
  EXPECT_TRUE(run.chief);
  EXPECT_EQ(run.train_examples, 160);
  EXPECT_EQ(run.pipeline.cardinality(), 10) << "by steps: stretches of eval_every batches";
  EXPECT_TRUE(run.fit.by_steps);
  EXPECT_EQ(run.fit.max_steps, 25);
  EXPECT_EQ(run.fit.input_order.at("[data] shuffle"), "true");  // compared on a mid-epoch resume
  EXPECT_EQ(run.fit.input_order.at("[data] train_limit"), "0");
  const data::LabelledData test = test_set(cfg);
  const train::FitResult r = run.trainer->fit(run.pipeline, &test, run.fit);
  EXPECT_EQ(r.steps, 25);
  ASSERT_EQ(r.history.size(), 3u);
  const auto loaded = load_trained_model(cfg, dir / "ckpt");
  EXPECT_EQ(flat(*loaded), flat(*run.model));
  // The same run again, from the same seed: the same initial weights and data, the same result.
  Config again = cfg;
  again.checkpoint_dir.clear();
  TrainingRun second = make_training_run(again);
  second.trainer->fit(second.pipeline, nullptr, second.fit);
  EXPECT_EQ(flat(*second.model), flat(*run.model));
}

// The evaluation set goes through the training augmentation's deterministic ops (it was left
// raw: a model trained on normalized images was measured on unnormalized ones, silently); the
// random ones are training's alone.
TEST(TrainingRun, TheTestSetIsNormalizedAsTheTrainingImagesAre) {
  TempDir dir;
  hpm::testing::write_synthetic_mnist(dir.path(), 16, 8);
  const std::string path = hpm::testing::small_mlp_config(dir, dir.path());
  const Config raw = load_config(path);
  const Config cfg = load_config(
      path, {"data.augment=[{ op = \"random_flip\" }, { op = \"normalize\", mean = 0.5, std = "
             "0.25 }]"});
  ASSERT_EQ(cfg.augment.size(), 2u);
  const std::vector<float> before = test_set(raw).inputs.to_vector();
  const std::vector<float> after = test_set(cfg).inputs.to_vector();
  ASSERT_EQ(after.size(), before.size());
  for (std::size_t i = 0; i < before.size(); ++i)
    ASSERT_FLOAT_EQ(after[i], (before[i] - 0.5f) / 0.25f) << i;
}

// TFRecord files matched by both globs: the test figures were of training data, reported as held
// out. Refused, naming the file.
TEST(TrainingRun, ATestSetSharingFilesWithTrainingIsRefused) {
  TempDir dir;
  std::ofstream(dir / "train-0.tfrecord") << "";
  std::ofstream(dir / "t10k-0.tfrecord") << "";
  const Config cfg =
      load_config(hpm::testing::small_mlp_config(dir, dir.path()),
                  {"data.source=\"tfrecord\"", "data.files=\"" + dir / "*.tfrecord" + "\"",
                   "data.test_files=\"" + dir / "t10k-*.tfrecord" + "\""});
  try {
    test_set(cfg);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("both match " + dir / "t10k-0.tfrecord"),
              std::string::npos)
        << e.what();
  }
}

// What a checkpoint records: the resolved config with [data] paths absolute, and its file.
TEST(TrainingRun, TheCheckpointDescriptionHasAbsoluteDataPaths) {
  TempDir dir;
  const std::string path = hpm::testing::small_mlp_config(dir, "relative/data");
  const Config cfg = load_config(path);
  const auto d = checkpoint_description(cfg);
  const toml::table recorded = toml::parse(d.at("config"));
  const std::string data_dir = recorded["data"]["dir"].value_or(std::string());
  EXPECT_TRUE(std::filesystem::path(data_dir).is_absolute()) << data_dir;
  EXPECT_EQ(data_dir, (std::filesystem::current_path() / "relative/data").string());
  EXPECT_EQ(d.at("config_path"), std::filesystem::absolute(path).lexically_normal().string());
}

}  // namespace
}  // namespace hpm::config
