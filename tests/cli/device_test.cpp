// [train] device and --device: a GPU that this machine or build does not have is an error naming
// the setting and what was found, before any work; a device name hpm does not know is a config
// error quoting it. (On a machine with a GPU, training there is the CUDA suite's and
// scripts/gpu_check.sh's business.)
#include <gtest/gtest.h>

#include <string>

#include "common/hpm_cli.h"
#include "common/temp_dir.h"
#include "hpm/tensor/backend.h"

namespace hpm::testing {
namespace {

bool machine_has_a_gpu() {
  if (!has_backend(DeviceType::kCuda)) return false;
  try {
    Device d(DeviceId{DeviceType::kCuda, 0}, "probe");
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

TEST(DeviceFlag, AGpuThatIsNotThereIsRefusedSayingWhatWasFound) {
  if (machine_has_a_gpu()) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  write_synthetic_mnist(dir.path(), 32, 16);
  const std::string config = small_mlp_config(dir, dir.path());
  for (const std::string device : {"cuda", "cuda:7"}) {
    const CommandResult r = run_hpm("train " + config + " --device " + device);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("[train] device = \"" + device + "\" cannot be used: "),
              std::string::npos)
        << r.output;
    const bool says_what = r.output.find("no usable CUDA driver") != std::string::npos ||
                           r.output.find("no CUDA device") != std::string::npos ||
                           r.output.find("built without CUDA") != std::string::npos;
    EXPECT_TRUE(says_what) << r.output;
    EXPECT_EQ(r.output.find("epoch 1"), std::string::npos) << "it trained: " << r.output;
  }
  // The same from the config file, naming where it was given.
  const std::string in_file = small_mlp_config(dir, dir.path(), "device = \"cuda\"\n");
  const CommandResult r = run_hpm("train " + in_file);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("mlp.toml:"), std::string::npos) << r.output;
}

TEST(DeviceFlag, AnUnknownDeviceNameIsAConfigErrorQuotingIt) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 32, 16);
  const std::string config = small_mlp_config(dir, dir.path());
  for (const std::string device : {"gpu", "cuda:", "cuda:x", "CUDA"}) {
    const CommandResult r = run_hpm("train " + config + " --device " + device);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(
        r.output.find("device must be \"cpu\", \"cuda\" or \"cuda:N\", got \"" + device + "\""),
        std::string::npos)
        << r.output;
  }
}

TEST(DeviceFlag, TheCpuIsTheDefaultAndCanBeNamed) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 64, 16);
  const std::string config = small_mlp_config(dir, dir.path());
  const CommandResult r = run_hpm("train " + config + " --device cpu");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find(", on "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hpm::testing
