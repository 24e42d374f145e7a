// Weights in and out from the command line: `[model] init_from` (strict, and not: with the report
// of what was missing or unexpected), `hpm evaluate --weights`, `hpm export --dtype`, teachers
// from weights alone, and each documented error. The PyTorch state dicts are the committed
// fixtures of tests/io/fixtures/generate_half_weights.py (the tests' small mlp).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/hpm_cli.h"
#include "hpm/train/checkpoint.h"

namespace hpm {
namespace {

using namespace hpm::testing;

const std::string kFixtures = std::string(HPM_SOURCE_DIR) + "/tests/io/fixtures/";

double test_loss(const std::string& report) { return report_number(report, "test_loss"); }

// The small mlp trained one epoch on synthetic data, its checkpoint in dir/ckpt; returns the
// config.
std::string train_one_epoch(const TempDir& dir) {
  write_synthetic_mnist(dir.path(), 200, 64);
  const std::string cfg = small_mlp_config(dir, dir.path());
  const CommandResult r =
      run_hpm("train " + cfg + " --set train.epochs=1 --set train.checkpoint_dir='\"" +
              dir / "ckpt" + "\"'");
  EXPECT_EQ(r.code, 0) << r.output;
  return cfg;
}

TEST(WeightsCommand, TorchBf16StateDictStartsTrainingAndEvaluates) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 200, 64);
  const std::string cfg = small_mlp_config(dir, dir.path());
  const std::string bf16 = kFixtures + "mlp_bf16.safetensors";
  // The weights as they are: evaluate them, then train from them.
  CommandResult ev =
      run_hpm("evaluate " + cfg + " --weights " + bf16 + " --report " + dir / "ev.json");
  ASSERT_EQ(ev.code, 0) << ev.output;
  EXPECT_NE(ev.output.find("4 tensors loaded, 4 cast to f32"), std::string::npos) << ev.output;
  CommandResult tr = run_hpm("train " + cfg + " --set model.init_from='\"" + bf16 +
                             "\"' --set train.epochs=1 --set train.checkpoint_dir='\"" +
                             dir / "ckpt" + "\"'" + " --report " + dir / "tr.json");
  ASSERT_EQ(tr.code, 0) << tr.output;
  EXPECT_NE(tr.output.find("init_from " + bf16 + ": 4 tensors loaded"), std::string::npos)
      << tr.output;
  // Training moved the weights away from the file's.
  CommandResult after = run_hpm("evaluate " + cfg + " --checkpoint " + dir / "ckpt" + " --report " +
                                dir / "after.json");
  ASSERT_EQ(after.code, 0) << after.output;
  EXPECT_LT(test_loss(dir / "after.json"), test_loss(dir / "ev.json"));
}

TEST(WeightsCommand, ExportToBf16AndF16EvaluatesLikeTheCheckpoint) {
  TempDir dir;
  const std::string cfg = train_one_epoch(dir);
  ASSERT_EQ(
      run_hpm("evaluate " + cfg + " --checkpoint " + dir / "ckpt" + " --report " + dir / "ref.json")
          .code,
      0);
  const double ref = test_loss(dir / "ref.json");
  for (const char* dtype : {"f32", "bf16", "f16"}) {
    SCOPED_TRACE(dtype);
    const std::string file = dir / (std::string("w_") + dtype + ".safetensors");
    CommandResult ex = run_hpm("export " + dir / "ckpt" + " -o " + file + " --dtype " + dtype);
    ASSERT_EQ(ex.code, 0) << ex.output;
    // The whole JSON header (its length: the first 8 bytes, little-endian): the metadata, the
    // checkpoint's config among it, comes first.
    const std::string bytes = read_text(file);
    std::uint64_t length = 0;
    for (int b = 7; b >= 0; --b) length = length << 8 | static_cast<unsigned char>(bytes[b]);
    const std::string header = bytes.substr(8, length);
    EXPECT_NE(header.find(std::string("\"") +
                          (dtype == std::string("f32")    ? "F32"
                           : dtype == std::string("bf16") ? "BF16"
                                                          : "F16") +
                          "\""),
              std::string::npos)
        << header;
    CommandResult ev =
        run_hpm("evaluate " + cfg + " --weights " + file + " --report " + dir / "ev.json");
    ASSERT_EQ(ev.code, 0) << ev.output;
    // f32: the same numbers; bf16 keeps 8 bits, f16 11.
    const double tol = dtype == std::string("f32")    ? 1e-9
                       : dtype == std::string("bf16") ? 2e-2
                                                      : 2e-3;
    EXPECT_NEAR(test_loss(dir / "ev.json"), ref, tol * ref);
  }
}

TEST(WeightsCommand, NonStrictReportsMissingAndUnexpected) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 100, 32);
  // A wider first layer than the fixture's: every entry of the mlp but the last layer's is off.
  const std::string cfg = dir / "other.toml";
  std::ofstream(cfg) << "[model]\nlayers = [{ type = \"flatten\" }, { type = \"linear\", in = 784, "
                        "out = 32 }, { type = \"relu\" }, { type = \"linear\", in = 32, out = 10 },"
                        " { type = \"relu\" }, { type = \"linear\", in = 10, out = 10 }]\n"
                     << "[data]\ndir = \"" << dir.path() << "\"\nbatch_size = 16\n"
                     << "[optimizer]\nkind = \"sgd\"\nlr = 0.05\n[train]\nepochs = 1\n";
  const std::string set = " --set model.init_from='\"" + kFixtures + "mlp_f16.safetensors\"'";
  CommandResult strict = run_hpm("train " + cfg + set);
  EXPECT_EQ(strict.code, 1);
  EXPECT_NE(strict.output.find("init_from = \"" + kFixtures +
                               "mlp_f16.safetensors\": load_state_dict: missing entry '5.weight' "
                               "(init_strict = false loads what matches)"),
            std::string::npos)
      << strict.output;
  CommandResult loose = run_hpm("train " + cfg + set + " --set model.init_strict=false");
  ASSERT_EQ(loose.code, 0) << loose.output;
  EXPECT_NE(loose.output.find("4 tensors loaded, 4 cast to f32"), std::string::npos)
      << loose.output;
  EXPECT_NE(loose.output.find("missing (left as initialized): 5.weight, 5.bias"), std::string::npos)
      << loose.output;
}

TEST(WeightsCommand, ErrorsNameWhatAndWhere) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 100, 32);
  const std::string cfg = small_mlp_config(dir, dir.path());
  CommandResult missing =
      run_hpm("train " + cfg + " --set model.init_from='\"" + dir / "nope.safetensors" + "\"'");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("init_from"), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find("no such file: " + dir / "nope.safetensors"), std::string::npos)
      << missing.output;
  // A file for another model: the first tensor whose shape differs, with both shapes.
  const std::string narrow = dir / "narrow.toml";
  std::ofstream(narrow) << "[model]\nlayers = [{ type = \"flatten\" }, { type = \"linear\", in = "
                           "784, out = 16 }, { type = \"relu\" }, { type = \"linear\", in = 16, "
                           "out = 10 }]\n[data]\ndir = \""
                        << dir.path() << "\"\n[optimizer]\nkind = \"sgd\"\nlr = 0.05\n";
  CommandResult shape =
      run_hpm("evaluate " + narrow + " --weights " + kFixtures + "mlp_bf16.safetensors");
  EXPECT_EQ(shape.code, 1);
  EXPECT_NE(
      shape.output.find("'1.weight' has shape [32, 784] F32, the model expects [16, 784] F32"),
      std::string::npos)
      << shape.output;
  CommandResult neither = run_hpm("evaluate " + cfg);
  EXPECT_EQ(neither.code, 1);
  EXPECT_NE(neither.output.find("give a checkpoint directory or a .safetensors weights file (one)"),
            std::string::npos)
      << neither.output;
  CommandResult corrupt = run_hpm("export " + dir / "nothing" + " -o " + dir / "x.safetensors");
  EXPECT_EQ(corrupt.code, 1);
  EXPECT_NE(corrupt.output.find("no checkpoint at " + dir / "nothing"), std::string::npos)
      << corrupt.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors"));
  CommandResult dtype =
      run_hpm("export " + dir / "nothing" + " -o " + dir / "x.safetensors" + " --dtype f8");
  EXPECT_EQ(dtype.code, 2) << dtype.output;
}

// An export into a checkpoint would replace its weights (which its checksum then rejects):
// refused, in any spelling, with the checkpoint as it was.
TEST(WeightsCommand, ExportIntoTheCheckpointIsRefused) {
  TempDir dir;
  const std::string cfg = train_one_epoch(dir);
  const std::string ckpt = train::resolve_checkpoint_dir(dir / "ckpt");
  const std::string weights = read_text(ckpt + "/model.safetensors");
  for (const std::string& out :
       {ckpt + "/model.safetensors", ckpt + "/./x.safetensors", dir / "ckpt/latest"}) {
    CommandResult ex = run_hpm("export " + dir / "ckpt" + " -o " + out);
    EXPECT_EQ(ex.code, 1) << out << ": " << ex.output;
    EXPECT_NE(ex.output.find("--output " + out + " is inside the checkpoint"), std::string::npos)
        << ex.output;
  }
  EXPECT_EQ(read_text(ckpt + "/model.safetensors"), weights);
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/x.safetensors"));
  EXPECT_EQ(run_hpm("evaluate " + cfg + " --checkpoint " + dir / "ckpt").code, 0);
}

// A teacher given as weights alone is loaded, not trained again over its directory.
TEST(WeightsCommand, TeacherFromWeightsAloneIsNotRetrained) {
  TempDir dir, teacher_dir;
  write_synthetic_mnist(dir.path(), 200, 64);
  const std::string teacher = small_mlp_config(teacher_dir, dir.path());
  const std::string weights_dir = dir / "teacher_weights";
  std::filesystem::create_directories(weights_dir);
  std::filesystem::copy_file(kFixtures + "mlp_bf16.safetensors",
                             weights_dir + "/model.safetensors");
  const std::string student = dir / "student.toml";
  std::ofstream(student) << "[model]\nlayers = [{ type = \"flatten\" }, { type = \"linear\", in = "
                            "784, out = 8 }, { type = \"relu\" }, { type = \"linear\", in = 8, "
                            "out = 10 }]\n[data]\ndir = \""
                         << dir.path()
                         << "\"\nbatch_size = 16\n[optimizer]\nkind = \"sgd\"\nlr = 0.05\n"
                            "[train]\nepochs = 1\n[distill]\nteacher_config = \""
                         << teacher << "\"\nteacher_checkpoint = \"" << weights_dir << "\"\n";
  for (const std::string& where : {weights_dir, weights_dir + "/model.safetensors"}) {
    CommandResult r = run_hpm("distill " + student + " --set distill.teacher_checkpoint='\"" +
                              where + "\"' --report " + dir / "r.json");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("weights from " + weights_dir + "/model.safetensors"),
              std::string::npos)
        << r.output;
    const auto j = nlohmann::json::parse(read_text(dir / "r.json"));
    EXPECT_FALSE(j["teachers"][0]["trained"].get<bool>()) << where;
    EXPECT_FALSE(std::filesystem::exists(weights_dir + "/latest")) << "nothing saved over it";
  }
}

// The other direction, where PyTorch is installed (the benchmarks' peers): an hpm export in bf16
// loads into torch's nn.Sequential and gives hpm's test loss on the same images.
TEST(WeightsCommand, Bf16ExportLoadsInPyTorch) {
  if (run_shell("/usr/bin/python3 -c 'import torch, numpy'").code != 0) {
    GTEST_SKIP() << "no PyTorch here (/usr/bin/python3 with python3-torch): the direction torch -> "
                    "hpm is covered by the committed fixtures";
  }
  TempDir dir;
  const std::string cfg = train_one_epoch(dir);
  const std::string file = dir / "w.safetensors";
  ASSERT_EQ(run_hpm("export " + dir / "ckpt" + " -o " + file + " --dtype bf16").code, 0);
  ASSERT_EQ(run_hpm("evaluate " + cfg + " --weights " + file + " --report " + dir / "ev.json").code,
            0);
  const std::string script = dir / "load.py";
  std::ofstream(script) << R"(import gzip, json, struct, sys, numpy as np, torch
path, data = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n]); header.pop("__metadata__", None)
state = {}
for name, e in header.items():
    b, end = e["data_offsets"]
    assert e["dtype"] == "BF16", e["dtype"]
    bits = np.frombuffer(raw[8 + n + b:8 + n + end], dtype=np.int16).copy()
    state[name] = torch.from_numpy(bits).view(torch.bfloat16).reshape(e["shape"])
m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
m.load_state_dict({k: v.float() for k, v in state.items()})
x = np.frombuffer(gzip.open(data + "/t10k-images-idx3-ubyte.gz").read(), np.uint8, offset=16)
y = np.frombuffer(gzip.open(data + "/t10k-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)
x = torch.tensor(x.reshape(-1, 1, 28, 28), dtype=torch.float32) / 255
with torch.no_grad():
    print(json.dumps({"test_loss": torch.nn.functional.cross_entropy(m(x), torch.tensor(y, dtype=torch.long)).item()}))
)";
  CommandResult py = run_shell("/usr/bin/python3 " + script + " " + file + " " + dir.path());
  ASSERT_EQ(py.code, 0) << py.output;
  const double torch_loss =
      nlohmann::json::parse(py.output.substr(py.output.rfind('{')))["test_loss"].get<double>();
  EXPECT_NEAR(torch_loss, test_loss(dir / "ev.json"), 1e-5 * torch_loss);
}

}  // namespace
}  // namespace hpm
