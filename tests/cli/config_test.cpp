#include "hpm/cli/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/temp_dir.h"

namespace hpm::cli {
namespace {

using hpm::testing::TempDir;

const char* kValid = R"([model]
layers = [
  { type = "flatten" },
  { type = "linear", in = 784, out = 10 },
]

[optimizer]
kind = "sgd"
lr = 0.1
)";

std::string write(const TempDir& dir, const std::string& text) {
  const std::string path = dir / "run.toml";
  std::ofstream(path) << text;
  return path;
}

// Loads `text` and returns the ConfigError message (fails the test if none is thrown).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  TempDir dir;
  const std::string path = write(dir, text);
  try {
    load_config(path, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for:\n" << text;
  return "";
}

TEST(Config, ValidConfigLoadsWithDefaults) {
  TempDir dir;
  Config c = load_config(write(dir, kValid));
  EXPECT_EQ(c.layers.size(), 2u);
  EXPECT_FLOAT_EQ(c.lr, 0.1f);
  EXPECT_EQ(c.batch_size, 64);
  EXPECT_EQ(c.data_dir, "/usr/share/datasets/fashion-mnist");
  auto model = build_model(c);
  EXPECT_EQ(model->num_parameters(), 7850);
}

TEST(Config, ExamplesLoadAndMatchThePeerModels) {
  auto mlp = build_model(load_config(std::string(HPM_SOURCE_DIR) + "/examples/fashion_mlp.toml"));
  EXPECT_EQ(mlp->num_parameters(), 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  auto cnn = build_model(load_config(std::string(HPM_SOURCE_DIR) + "/examples/fashion_cnn.toml"));
  EXPECT_EQ(cnn->num_parameters(),
            32 * 9 + 32 + 64 * 32 * 9 + 64 + 3136 * 128 + 128 + 128 * 10 + 10);
}

TEST(Config, UnknownKeyNamesItAndItsLine) {
  const std::string msg = error_of(std::string(kValid) + "lrr = 0.2\n");
  EXPECT_NE(msg.find("run.toml:10:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'lrr' in [optimizer]"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesKeyAndType) {
  TempDir dir;
  std::string text = kValid;
  text.replace(text.find("lr = 0.1"), 8, "lr = \"fast\"");
  const std::string msg = error_of(text);
  EXPECT_NE(msg.find(":9:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[optimizer] lr must be a number, got string"), std::string::npos) << msg;
}

TEST(Config, UnknownLayerNamesItAndItsLine) {
  std::string text = kValid;
  text.replace(text.find("\"linear\""), 8, "\"lineer\"");
  const std::string msg = error_of(text);
  EXPECT_NE(msg.find(":4:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown layer type 'lineer'"), std::string::npos) << msg;
}

TEST(Config, UnknownLayerKeyAndMissingLayerKey) {
  std::string text = kValid;
  text.replace(text.find("out = 10"), 8, "outt = 10");
  EXPECT_NE(error_of(text).find("unknown key 'outt' for layer linear"), std::string::npos);
  TempDir dir;
  std::string text2 = kValid;
  text2.replace(text2.find(", out = 10"), 10, "");
  try {
    build_model(load_config(write(dir, text2)));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layer linear needs 'out'"), std::string::npos)
        << e.what();
  }
}

TEST(Config, UnknownSectionAndSyntaxError) {
  EXPECT_NE(error_of(std::string(kValid) + "[trian]\nepochs = 2\n").find("unknown section [trian]"),
            std::string::npos);
  const std::string msg = error_of("[model\nlayers = []\n");
  EXPECT_NE(msg.find("run.toml:1:"), std::string::npos) << msg;
}

TEST(Config, OverridesApplyAndAreChecked) {
  TempDir dir;
  Config c = load_config(write(dir, kValid),
                         {"optimizer.lr=0.5", "train.epochs=3", "train.checkpoint_dir=/tmp/x"});
  EXPECT_FLOAT_EQ(c.lr, 0.5f);
  EXPECT_EQ(c.epochs, 3);
  EXPECT_EQ(c.checkpoint_dir, "/tmp/x");
  EXPECT_NE(error_of(kValid, {"train.epoch=3"}).find("unknown key 'epoch' in [train]"),
            std::string::npos);
  EXPECT_NE(error_of(kValid, {"nodot"}).find("expected section.key=value"), std::string::npos);
  EXPECT_NE(error_of(kValid, {"train.epochs=0"}).find("epochs must be a positive value"),
            std::string::npos);
}

}  // namespace
}  // namespace hpm::cli
