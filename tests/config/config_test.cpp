#include "hpm/config/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include "common/temp_dir.h"
#include "hpm/tensor/kernels.h"

namespace hpm::config {
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

std::string error_of_path(const std::string& path) {
  try {
    load_config(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
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
  // torch_gpt.py's default model: the parameter count its JSON line reports.
  const Config gpt = load_config(std::string(HPM_SOURCE_DIR) + "/examples/fortunes_gpt.toml");
  EXPECT_EQ(build_model(gpt)->num_parameters(), 834304);
  EXPECT_EQ(gpt.epochs, 4) << "2000 steps, evaluated every 500";
  EXPECT_EQ(build_model(load_config(std::string(HPM_SOURCE_DIR) + "/examples/fashion_resnet.toml"))
                ->blocks()
                .size(),
            11u);
}

// A directory is named as one (it parsed as an empty file: "missing [model] section"); a pipe
// (/dev/stdin, a FIFO) is read like a file.
TEST(Config, ADirectoryIsNamedAndAPipeIsRead) {
  TempDir dir;
  try {
    load_config(dir.path());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), dir.path() +
                                         ": is a directory, not a config file (give the "
                                         ".toml file in it)");
  }
  const std::string fifo = dir / "run.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo) << kValid; });
  const Config c = load_config(fifo);
  writer.join();
  EXPECT_EQ(c.layers.size(), 2u);
  EXPECT_NE(error_of_path(dir / "missing.toml").find("missing.toml: cannot open: No such file"),
            std::string::npos);
}

// A directory where a file belongs is named as one, with its key.
TEST(Config, ADirectoryGivenForAFileSettingIsNamed) {
  TempDir dir;
  std::string msg = error_of(kValid, {"model.init_from=\"" + dir.path() + "\""});
  EXPECT_NE(
      msg.find("[model] init_from " + dir.path() + " is a directory, not a .safetensors file"),
      std::string::npos)
      << msg;
  msg = error_of(
      "[model]\nkind = \"gpt\"\nvocab_size = 256\n[data]\nsource = \"text\"\nfiles = \"x\"\n",
      {"data.tokenizer=\"" + dir.path() + "\""});
  EXPECT_NE(msg.find("[data] tokenizer " + dir.path() +
                     " is a directory, not a SentencePiece .model file"),
            std::string::npos)
      << msg;
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
  // An error caused by an override names the override, not the file, and quotes the value.
  const std::string range = error_of(kValid, {"train.epochs=0"});
  EXPECT_NE(range.find("--set train.epochs=0: [train] epochs must be positive, got 0"),
            std::string::npos)
      << range;
  const std::string typo = error_of(kValid, {"train.epoch=3"});
  EXPECT_EQ(typo.rfind("--set train.epoch=3: unknown key 'epoch' in [train]", 0), 0u) << typo;
  const std::string type = error_of(kValid, {"optimizer.lr=fast"});
  EXPECT_NE(
      type.find("--set optimizer.lr=fast: [optimizer] lr must be a number, got string \"fast\""),
      std::string::npos)
      << type;
}

// Keys the chosen source would ignore without a word are refused, naming the key and the source:
// files given to the default idx source (it trained on Fashion-MNIST), a text model's shuffle or
// augment. Another source's location left by a --set of source passes.
TEST(Config, DataKeysTheSourceIgnoresAreRefused) {
  std::string msg = error_of(kValid, {"data.files=\"my/*.tfrecord\""});
  EXPECT_NE(msg.find("[data] files does not apply to source = \"idx\", which would ignore it"),
            std::string::npos)
      << msg;
  const std::string text =
      "[model]\nkind = \"gpt\"\nvocab_size = 256\n[data]\nsource = "
      "\"text\"\nfiles = \"x\"\n";
  for (const char* key : {"data.shuffle=false", "data.augment=[{ op = \"random_flip\" }]",
                          "data.train_limit=10", "data.prefetch=2"}) {
    msg = error_of(text, {key});
    EXPECT_NE(msg.find("does not apply to source = \"text\""), std::string::npos) << key << msg;
  }
  for (const char* buffer : {"data.shuffle_buffer=0", "data.shuffle_buffer=-5"}) {
    msg = error_of(kValid, {buffer});
    EXPECT_NE(msg.find("shuffle_buffer must be -1 (the whole training set) or a positive count"),
              std::string::npos)
        << buffer << msg;
  }
  // random_crop's padding is a pixel count: 4.0, "4" or -1 was dropped without a word (no padding).
  for (const char* padding : {"4.0", "\"4\"", "-1"}) {
    msg = error_of(kValid,
                   {std::string("data.augment=[{ op = \"random_crop\", size = 28, padding = ") +
                    padding + " }]"});
    EXPECT_NE(msg.find("random_crop padding must be an integer from 0 to 4096"), std::string::npos)
        << padding << msg;
  }
  TempDir dir;
  EXPECT_EQ(load_config(write(dir, kValid),
                        {"data.augment=[{ op = \"random_crop\", size = 28, padding = 4 }]"})
                .augment.at(0)
                .padding,
            4);
  EXPECT_NO_THROW(load_config(write(dir, kValid), {"data.shuffle_buffer=100"}));
  EXPECT_NO_THROW(
      load_config(write(dir, text), {"data.source=\"random_tokens\"", "train.max_steps=10"}));
  EXPECT_NO_THROW(
      load_config(write(dir, std::string(kValid) + "[data]\ndir = \"d\"\n"),
                  {"data.source=\"tfrecord\"", "data.files=\"a\"", "data.test_files=\"b\""}));
}

// Workers take their share of one order: a pipeline whose order differs between processes trained
// some examples twice an epoch and others never, without a word.
TEST(Config, MultiWorkerTrainingNeedsADeterministicOrderUnlessEachReadsItsOwnFiles) {
  const std::string msg =
      error_of(kValid, {"strategy.kind=\"multi_worker_mirrored\"", "data.deterministic=false"});
  EXPECT_NE(msg.find("[strategy] multi_worker_mirrored with shard = \"batch\" needs [data] "
                     "deterministic = true"),
            std::string::npos)
      << msg;
  TempDir dir;
  EXPECT_NO_THROW(
      load_config(write(dir, std::string(kValid) + "[data]\ndir = \"d\"\n"),
                  {"strategy.kind=\"multi_worker_mirrored\"", "data.deterministic=false",
                   "strategy.shard=\"files\"", "data.source=\"tfrecord\"", "data.files=\"a\"",
                   "data.test_files=\"b\""}));
  EXPECT_NO_THROW(
      load_config(write(dir, kValid), {"strategy.kind=\"mirrored\"", "data.deterministic=false"}));
}

// [optimizer] weight_decay_min_rank reaches SGD as it reaches AdamW (it was dropped for SGD: every
// bias decayed).
TEST(Config, SgdTakesWeightDecayMinRank) {
  TempDir dir;
  const Config c = load_config(write(dir, kValid),
                               {"optimizer.weight_decay=0.5", "optimizer.weight_decay_min_rank=2"});
  const auto model = build_model(c);
  const auto opt = build_optimizer(c, *model);
  std::vector<std::vector<float>> before;
  for (auto& [name, p] : model->named_parameters()) {
    p.set_grad(Tensor::zeros(p.shape()));
    before.push_back(p.to_vector());
  }
  opt->clip_and_step(0.0f);
  const nn::NamedTensors after = model->named_parameters();
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[1].second.dim(), 1);
  EXPECT_EQ(after[1].second.to_vector(), before[1]) << "the bias decayed";
  EXPECT_NE(after[0].second.to_vector(), before[0]) << "the weight did not";
}

// Each kind's defaults are torch.optim's where its user would expect them: an AdamW without a lr
// ran at 0.01 (10x torch's) with no weight decay.
TEST(Config, OptimizerDefaultsAreEachKindsOwn) {
  TempDir dir;
  const Config sgd = load_config(write(dir, kValid), {"optimizer.lr=0.05"});
  EXPECT_FLOAT_EQ(sgd.lr, 0.05f);
  EXPECT_EQ(sgd.weight_decay, 0.0f);
  std::string text = kValid;
  const std::string sgd_lines = "kind = \"sgd\"\nlr = 0.1\n";
  text.replace(text.find(sgd_lines), sgd_lines.size(), "kind = \"adamw\"\n");
  const Config adamw = load_config(write(dir, text));
  EXPECT_FLOAT_EQ(adamw.lr, 1e-3f);
  EXPECT_FLOAT_EQ(adamw.weight_decay, 0.01f);
  const Config adam = load_config(write(dir, text), {"optimizer.kind=\"adam\""});
  EXPECT_FLOAT_EQ(adam.lr, 1e-3f);
  EXPECT_EQ(adam.weight_decay, 0.0f);
  const Config given =
      load_config(write(dir, text), {"optimizer.lr=0.02", "optimizer.weight_decay=0"});
  EXPECT_FLOAT_EQ(given.lr, 0.02f);
  EXPECT_EQ(given.weight_decay, 0.0f);
}

TEST(Config, NegativeLimitsAndSeedsAreRefusedWithTheirPlace) {
  std::string msg = error_of(std::string(kValid) + "\n[data]\ntrain_limit = -5\n");
  EXPECT_NE(msg.find("run.toml:12:15: [data] train_limit must be >= 0, got -5"), std::string::npos)
      << msg;
  msg = error_of(kValid, {"data.test_limit=-1"});
  EXPECT_NE(msg.find("--set data.test_limit=-1: [data] test_limit must be >= 0, got -1"),
            std::string::npos)
      << msg;
  msg = error_of(std::string(kValid) + "\n[train]\nseed = -3\n");
  EXPECT_NE(msg.find("[train] seed must be >= 0, got -3"), std::string::npos) << msg;
}

// A setting is kept whole or refused: an integer beyond its type kept only its low bits
// (4294967297 threads ran as 1), a float beyond its type became inf, and a budget in MiB
// overflowed its bytes to 0.
TEST(Config, SettingsTooLargeForTheirTypeAreRefusedNotTruncated) {
  for (const auto& [set, expect] : std::vector<std::pair<std::string, std::string>>{
           {"train.threads=4294967297",
            "[train] threads must be between -2147483648 and 2147483647, got 4294967297"},
           {"train.accumulation_steps=9223372036854775807",
            "[train] accumulation_steps must be between -2147483648 and 2147483647"},
           {"optimizer.lr=1e39", "[optimizer] lr must be a finite number"},
           {"memory.device_budget_mb=1e30", "[memory] device_budget_mb must be at most 1e12"},
           {"strategy.bucket_mb=1e300", "[strategy] bucket_mb must be positive and at most 1e6"},
       }) {
    const std::string msg = error_of(kValid, {set});
    EXPECT_NE(msg.find("--set " + set + ": " + expect), std::string::npos) << msg;
  }
}

TEST(Config, AnIntegerTooLargeIsOutOfRangeNotAString) {
  std::string msg = error_of(kValid, {"data.train_limit=99999999999999999999"});
  EXPECT_NE(msg.find("--set data.train_limit=99999999999999999999: 99999999999999999999 is out "
                     "of range for a 64-bit integer (-2^63..2^63-1)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("string"), std::string::npos) << msg;
  msg = error_of(kValid, {"train.seed=-99999999999999999999"});
  EXPECT_NE(msg.find("is out of range for a 64-bit integer"), std::string::npos) << msg;
}

TEST(Config, OutOfRangeValuesInTheFileAreQuotedWithTheirPlace) {
  const std::string msg = error_of(std::string(kValid) + "\n[memory]\nrecompute_every = -2\n");
  EXPECT_NE(msg.find("run.toml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[memory] recompute_every must be positive, got -2"), std::string::npos)
      << msg;
}

// Values that would train silently wrong (or fail at the first step, far from the file) are
// refused where they are read, naming the key and its place; NaN too, and the largest double is
// quoted in its 23 characters.
TEST(Config, OptimizerAndTrainingRangesAreRefusedWithTheirPlace) {
  std::string msg = error_of(std::string(kValid) + "weight_decay = -0.5\n");
  EXPECT_NE(msg.find("run.toml:10:16: [optimizer] weight_decay must be >= 0, got -0.5"),
            std::string::npos)
      << msg;
  msg = error_of(std::string(kValid) + "eps = -0.25\n");
  EXPECT_NE(msg.find("run.toml:10:7: [optimizer] eps must be >= 0, got -0.25"), std::string::npos)
      << msg;
  msg = error_of(kValid, {"optimizer.lr=-1.0"});
  EXPECT_NE(msg.find("--set optimizer.lr=-1.0: [optimizer] lr must be >= 0, got -1.0"),
            std::string::npos)
      << msg;
  msg = error_of(kValid, {"optimizer.beta2=1.0"});
  EXPECT_NE(msg.find("[optimizer] beta2 must be in [0, 1), got 1.0"), std::string::npos) << msg;
  msg = error_of(kValid, {"train.clip_grad_norm=-1.0"});
  EXPECT_NE(msg.find("--set train.clip_grad_norm=-1.0: [train] clip_grad_norm must be >= 0, got "
                     "-1.0"),
            std::string::npos)
      << msg;
  msg = error_of(std::string(kValid) + "[train]\nclip_grad_norm = nan\n");
  EXPECT_NE(msg.find("run.toml:11:18: [train] clip_grad_norm must be >= 0, got nan"),
            std::string::npos)
      << msg;
  msg = error_of(kValid, {"train.label_smoothing=1.5"});
  EXPECT_NE(msg.find("--set train.label_smoothing=1.5: [train] label_smoothing must be in [0, 1], "
                     "got 1.5"),
            std::string::npos)
      << msg;
  msg = error_of(kValid, {"train.label_smoothing=nan"});
  EXPECT_NE(msg.find("[train] label_smoothing must be in [0, 1], got nan"), std::string::npos)
      << msg;
  msg = error_of(kValid, {"schedule.warmup_start_factor=2.0"});
  EXPECT_NE(msg.find("[schedule] warmup_start_factor must be in [0, 1], got 2.0"),
            std::string::npos)
      << msg;
  msg = error_of(kValid, {"train.clip_grad_norm=-1.7976931348623157e308"});
  EXPECT_NE(msg.find("got -1.7976931348623157e+308"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 200u) << msg;
  // The edges are values.
  TempDir dir;
  const Config c = load_config(
      write(dir, kValid),
      {"train.label_smoothing=1.0", "train.clip_grad_norm=0.0", "optimizer.weight_decay=0.0"});
  EXPECT_FLOAT_EQ(c.label_smoothing, 1.0f);
}

TEST(Config, ModelKindsGptAndResNet) {
  TempDir dir;
  const std::string gpt = R"([model]
kind = "gpt"
n_layer = 2
n_head = 2
n_embd = 16
block_size = 8
vocab_size = 32
tie_weights = false
[data]
source = "text"
[train]
max_steps = 10
)";
  Config c = load_config(write(dir, gpt));
  EXPECT_EQ(c.model_kind, "gpt");
  auto model = build_model(c);
  EXPECT_EQ(model->type_name(), "GPT");
  EXPECT_EQ(model->blocks().size(), 4u);
  EXPECT_FALSE(std::static_pointer_cast<nn::GPT>(model)->head->weight.same_storage(
      std::static_pointer_cast<nn::GPT>(model)->tok->weight));
  const std::string resnet = R"([model]
kind = "resnet"
in_channels = 1
num_classes = 10
widths = [16, 32, 64]
blocks = [3, 3, 3]
)";
  auto r = build_model(load_config(write(dir, resnet)));
  EXPECT_EQ(r->type_name(), "ResNet");
  EXPECT_EQ(r->blocks().size(), 11u) << "stem, 9 BasicBlocks, head: ResNet-20";
  EXPECT_NE(
      error_of(gpt, {"model.n_head=3"}).find("n_embd must be a multiple of n_head (3), got 16"),
      std::string::npos);
  EXPECT_NE(
      error_of(gpt, {"model.kind=transformer"})
          .find("[model] kind must be \"layers\", \"gpt\" or \"resnet\", got \"transformer\""),
      std::string::npos);
  EXPECT_NE(error_of(gpt, {"model.widths=[1]"}).find("unknown key 'widths' in [model]"),
            std::string::npos)
      << "resnet's keys are not gpt's";
  EXPECT_EQ(c.files, "/usr/share/games/fortunes/*") << "text's default corpus";
  EXPECT_EQ(c.epochs, 1) << "one stretch of max_steps, evaluated at its end";
  EXPECT_NE(error_of(gpt, {"data.source=idx"}).find("a GPT trains on [data] source = \"text\""),
            std::string::npos);
  EXPECT_NE(error_of(resnet, {"data.source=text"}).find("and only a GPT does"), std::string::npos);
  EXPECT_NE(error_of(gpt, {"train.max_steps=0"}).find("max_steps must be positive, got 0"),
            std::string::npos);
  EXPECT_NE(error_of(resnet, {"model.blocks=[3, 3]"})
                .find("blocks must name as many stages as widths (3), got 2"),
            std::string::npos);
  EXPECT_NE(error_of(resnet, {"model.widths=[16, \"x\", 64]"})
                .find("widths must be an array of integers"),
            std::string::npos);
}

}  // namespace
}  // namespace hpm::config

namespace hpm::config {
namespace {

// Pipeline stages run the autocast scope (tests/pipeline/models_test.cpp,
// PipelineModels.Bf16StagesMatchOneDeviceInBf16): bf16 with [pipeline] is a valid config.
TEST(Config, Bf16ReachesPipelineStages) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  TempDir dir;
  const Config c = load_config(write(
      dir, std::string(kValid) + "\n[train]\nprecision = \"bf16\"\n[pipeline]\nstages = 2\n"));
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_TRUE(c.pipeline.present);
}

TEST(Config, PrecisionIsF32OrBf16WhereNative) {
  const std::string msg = error_of(std::string(kValid) + "\n[train]\nprecision = \"fp16\"\n");
  EXPECT_NE(msg.find("run.toml:12:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[train] precision must be \"f32\" or \"bf16\", got \"fp16\""),
            std::string::npos)
      << msg;
  TempDir dir;
  const std::string path = write(dir, std::string(kValid) + "\n[train]\nprecision = \"bf16\"\n");
  if (kernels::native_bf16()) {
    EXPECT_EQ(load_config(path, {}).precision, "bf16");
  } else {
    const std::string refused = error_of(std::string(kValid) + "\n[train]\nprecision = \"bf16\"\n");
    EXPECT_NE(refused.find("AVX512_BF16"), std::string::npos) << refused;
  }
}

}  // namespace
}  // namespace hpm::config
