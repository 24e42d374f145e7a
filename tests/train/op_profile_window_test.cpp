// OpProfileWindow inside a real fit: every step but the first is profiled, nothing between steps
// (the epoch's evaluation) is, and the table reaches its file.
#include "hpm/train/op_profile_window.h"

#include <gtest/gtest.h>

#include "common/blobs.h"
#include "common/temp_dir.h"
#include "hpm/io/atomic_file.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/op_profile.h"
#include "hpm/tensor/random.h"

namespace hpm::train {
namespace {

TEST(OpProfileWindow, ProfilesTheStepsAfterTheFirstAndWritesTheTable) {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 3)});
  auto opt = std::make_shared<optim::SGD>(model->named_parameters(), optim::SgdOptions{0.05f});
  Trainer trainer(model, opt);
  const testing::TempDir dir;
  const std::string path = dir.path() + "/ops.txt";
  auto window = std::make_shared<OpProfileWindow>(path);
  trainer.add_callback(window);
  const auto train = testing::blobs(5 * 32, 1), test = testing::blobs(64, 2);
  FitOptions f;
  f.batch_size = 32;
  f.epochs = 1;
  trainer.fit(train, &test, f);

  EXPECT_EQ(window->steps(), 4);
  EXPECT_GT(window->seconds(), 0.0);
  EXPECT_FALSE(op_profile::enabled());
  const auto rows = op_profile::rows();
  const auto calls = [&](const std::string& name) -> std::int64_t {
    std::int64_t n = 0;
    for (const auto& r : rows)
      if (r.name == name) n += r.calls;
    return n;
  };
  // Two Linear layers: a forward product each per step, nothing from evaluation's batches.
  EXPECT_EQ(calls("linear"), 2 * 4);
  EXPECT_EQ(calls("sgd_step_"), 4 * 4);  // four parameters
  const std::string table = io::read_file(path);
  EXPECT_NE(table.find("linear"), std::string::npos) << table;
  EXPECT_NE(table.find("(outside ops)"), std::string::npos) << table;
}

}  // namespace
}  // namespace hpm::train
