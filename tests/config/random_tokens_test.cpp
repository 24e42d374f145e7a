// [data] source = "random_tokens": a GPT timed on a vocabulary no corpus here is encoded in
// (GPT-2's 50304): uniform ids from the run's seed, windows as from any corpus, no files.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "common/temp_dir.h"
#include "hpm/config/datasets.h"
#include "hpm/config/training_run.h"

namespace hpm::config {
namespace {

std::string random_token_gpt(const hpm::testing::TempDir& dir) {
  const std::string path = dir / "gpt.toml";
  std::ofstream(path) << "[model]\nkind = \"gpt\"\nvocab_size = 50304\nn_layer = 1\nn_head = 2\n"
                         "n_embd = 32\nblock_size = 16\n"
                      << "[data]\nsource = \"random_tokens\"\nbatch_size = 4\n"
                      << "[optimizer]\nkind = \"adamw\"\nlr = 0.001\n"
                      << "[train]\nmax_steps = 3\neval_every = 3\neval_iters = 2\n";
  return path;
}

TEST(RandomTokens, UniformIdsFromTheSeedInBothSplits) {
  hpm::testing::TempDir dir;
  const Config cfg = load_config(random_token_gpt(dir));
  EXPECT_TRUE(cfg.token_source());
  const std::vector<std::int64_t> train = training_tokens(cfg).to_tensor().to_vector_i64();
  ASSERT_GE(train.size(), std::size_t{1} << 20);
  EXPECT_GE(*std::min_element(train.begin(), train.end()), 0);
  EXPECT_LT(*std::max_element(train.begin(), train.end()), 50304);
  EXPECT_GT(*std::max_element(train.begin(), train.end()), 50000) << "the whole vocabulary";
  const data::LabelledData val = test_set(cfg);
  EXPECT_EQ(val.size(), 2 * 4) << "eval_iters batches of windows";
  EXPECT_EQ(val.inputs.size(1), 16);
  // Another seed, other tokens; the same seed, the same (a run resumes on the same data).
  const Config other = load_config(random_token_gpt(dir), {"train.seed=7"});
  EXPECT_NE(training_tokens(other).to_tensor().to_vector_i64(), train);
  EXPECT_EQ(training_tokens(load_config(random_token_gpt(dir))).to_tensor().to_vector_i64(), train);
}

TEST(RandomTokens, AGptTrainsOnThemByStepsAtTheUniformLoss) {
  hpm::testing::TempDir dir;
  const Config cfg = load_config(random_token_gpt(dir));
  TrainingRun run = make_training_run(cfg);
  const data::LabelledData val = test_set(cfg);
  const train::FitResult r = run.trainer->fit(run.pipeline, &val, run.fit);
  EXPECT_EQ(r.steps, 3);
  // Nothing to learn: the loss stays near ln(50304) = 10.83.
  EXPECT_NEAR(run.trainer->evaluate(val).loss, 10.83, 0.3);
}

}  // namespace
}  // namespace hpm::config
