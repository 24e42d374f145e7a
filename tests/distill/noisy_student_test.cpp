// Noisy Student: pseudo-label selection (threshold, class balancing, soft and hard) on hand-made
// probabilities, training on soft targets, the round loop's teacher swap, and `hpm distill` with
// a [noisy_student] section end to end.
#include "hpm/distill/noisy_student.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/blobs.h"
#include "common/hpm_cli.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

using distill::PseudoLabelKind;
using distill::PseudoLabelOptions;

// Rows' top classes and confidences: 0 (0.7), 1 (0.5), 0 (0.9), 2 (0.4), 0 (0.6), 1 (0.8).
Tensor probs6() {
  return Tensor::from({0.7f, 0.2f, 0.1f,    //
                       0.3f, 0.5f, 0.2f,    //
                       0.9f, 0.05f, 0.05f,  //
                       0.3f, 0.3f, 0.4f,    //
                       0.6f, 0.3f, 0.1f,    //
                       0.1f, 0.8f, 0.1f},
                      {6, 3});
}

TEST(PseudoLabels, ThresholdKeepsConfidentRowsInOrderWithTheirProbabilities) {
  PseudoLabelOptions o;
  o.confidence_threshold = 0.6f;
  const auto pl = distill::pseudo_label(probs6(), o);
  EXPECT_EQ(pl.rows, (std::vector<std::int64_t>{0, 2, 4, 5}));
  EXPECT_EQ(pl.classes.to_vector_i64(), (std::vector<std::int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(pl.targets.to_vector(), (std::vector<float>{0.7f, 0.2f, 0.1f, 0.9f, 0.05f, 0.05f, 0.6f,
                                                        0.3f, 0.1f, 0.1f, 0.8f, 0.1f}));
  // No threshold: every row.
  EXPECT_EQ(distill::pseudo_label(probs6(), {}).rows.size(), 6u);
}

TEST(PseudoLabels, HardLabelsAreOneHotOfTheTopClass) {
  PseudoLabelOptions o;
  o.kind = PseudoLabelKind::kHard;
  o.confidence_threshold = 0.45f;
  const auto pl = distill::pseudo_label(probs6(), o);
  EXPECT_EQ(pl.rows, (std::vector<std::int64_t>{0, 1, 2, 4, 5}));
  EXPECT_EQ(pl.targets.to_vector(),
            (std::vector<float>{1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0}));
}

TEST(PseudoLabels, BalancingKeepsTheMostConfidentAndRepeatsTheRare) {
  PseudoLabelOptions o;
  o.balance_classes = true;
  // Counts: class 0 has rows {0, 2, 4}, class 1 {1, 5}, class 2 {3}: mean 2 per class.
  auto pl = distill::pseudo_label(probs6(), o);
  // Class 0 keeps its two most confident (2: 0.9, 0: 0.7); class 1 both (5: 0.8, 1: 0.5);
  // class 2 repeats its only row.
  EXPECT_EQ(pl.rows, (std::vector<std::int64_t>{2, 0, 5, 1, 3, 3}));
  EXPECT_EQ(pl.classes.to_vector_i64(), (std::vector<std::int64_t>{0, 0, 1, 1, 2, 2}));
  // An explicit count, after a threshold that empties class 2.
  o.per_class = 3;
  o.confidence_threshold = 0.5f;
  pl = distill::pseudo_label(probs6(), o);
  EXPECT_EQ(pl.rows, (std::vector<std::int64_t>{2, 0, 4, 5, 1, 5}));
}

TEST(PseudoLabels, RejectsBadOptions) {
  PseudoLabelOptions o;
  o.confidence_threshold = 1.5f;
  EXPECT_THROW(distill::pseudo_label(probs6(), o), std::invalid_argument);
  EXPECT_THROW(distill::one_hot(Tensor::from_i64(std::vector<std::int64_t>{3}, {1}), 3),
               std::invalid_argument);
}

// ---- training and rounds ------------------------------------------------------------------------

std::shared_ptr<nn::Module> mlp(std::int64_t hidden, float dropout) {
  std::vector<std::shared_ptr<nn::Module>> layers;
  layers.push_back(std::make_shared<nn::Linear>(8, hidden));
  layers.push_back(std::make_shared<nn::ReLU>());
  if (dropout > 0) layers.push_back(std::make_shared<nn::Dropout>(dropout));
  layers.push_back(std::make_shared<nn::Linear>(hidden, 3));
  return std::make_shared<nn::Sequential>(layers);
}

std::shared_ptr<optim::Optimizer> noisy_student_sgd(nn::Module& m) {
  return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.05f, 0.9f});
}

std::vector<std::vector<float>> values(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, t] : m.state_dict()) out.push_back(t.to_vector());
  return out;
}

TEST(NoisyStudent, OneHotTargetsTeachLikeLabels) {
  const auto train = testing::blobs(512, 1), test = testing::blobs(300, 9);
  manual_seed(2);
  auto model = mlp(16, 0.0f);
  auto opt = noisy_student_sgd(*model);
  distill::TargetFitOptions fit;
  fit.epochs = 3;
  fit.batch_size = 32;
  const double loss =
      distill::fit_targets(*model, *opt, train.inputs, distill::one_hot(train.labels, 3), fit);
  EXPECT_LT(loss, 0.5);
  EXPECT_GT(distill::ensemble_accuracy({model}, test), 0.85);
}

TEST(NoisyStudent, InputNoiseChangesTrainingButNotTheData) {
  Generator gen(4);
  const Tensor images = Tensor::uniform({64, 1, 6, 6}, gen, 0.0f, 1.0f);
  const auto before = images.to_vector();
  std::vector<std::int64_t> y(64);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int64_t>(i % 3);
  const Tensor targets = distill::one_hot(Tensor::from_i64(y, {64}), 3);
  const auto train = [&](std::vector<data::AugmentOp> noise) {
    manual_seed(5);
    auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(36, 3)});
    auto opt = noisy_student_sgd(*model);
    distill::TargetFitOptions fit;
    fit.epochs = 2;
    fit.batch_size = 16;
    fit.augment = std::move(noise);
    distill::fit_targets(*model, *opt, images, targets, fit);
    return values(*model);
  };
  const auto plain = train({});
  EXPECT_EQ(train({}), plain);  // deterministic
  data::AugmentOp crop{"random_crop", 1, 6, 6, {}, {}}, flip{"random_flip", 0, 0, 0, {}, {}};
  EXPECT_NE(train({crop, flip}), plain);
  EXPECT_EQ(images.to_vector(), before);
}

TEST(NoisyStudent, EachRoundsStudentTeachesTheNextAndTeachersStayUntouched) {
  const auto all = testing::blobs(600, 1), test = testing::blobs(300, 9);
  const data::LabelledData labelled{all.inputs.narrow(0, 60), all.labels.narrow(0, 60)};
  const Tensor unlabelled = all.inputs.narrow(60, 540);
  manual_seed(3);
  std::shared_ptr<nn::Module> teacher = mlp(16, 0.0f);
  {
    auto opt = noisy_student_sgd(*teacher);
    distill::TargetFitOptions fit;
    fit.epochs = 10;
    fit.batch_size = 16;
    distill::fit_targets(*teacher, *opt, labelled.inputs, distill::one_hot(labelled.labels, 3),
                         fit);
  }
  const auto teacher_values = values(*teacher);
  const double teacher_acc = distill::ensemble_accuracy({teacher}, test);

  distill::NoisyStudentOptions o;
  o.rounds = 2;
  o.pseudo.kind = PseudoLabelKind::kHard;
  o.pseudo.confidence_threshold = 0.5f;
  o.fit.epochs = 3;
  o.fit.batch_size = 32;
  int calls = 0;
  const auto rounds = distill::noisy_student(
      teacher, {[] { return mlp(32, 0.2f); }, noisy_student_sgd}, labelled, unlabelled, &test, o,
      [&](const distill::NoisyStudentRound& r) { EXPECT_EQ(r.round, ++calls); });
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(rounds[0].teacher, teacher);
  EXPECT_EQ(rounds[1].teacher, rounds[0].student);  // the swap
  EXPECT_NE(rounds[1].student, rounds[0].student);
  EXPECT_EQ(values(*teacher), teacher_values);
  EXPECT_GT(rounds[0].pseudo_labelled, 0);
  EXPECT_LE(rounds[0].pseudo_labelled, 540);
  // Blobs are easy: the students learn from the pseudo-labels at least as well as the teacher
  // (less a margin for noise).
  for (const auto& r : rounds) EXPECT_GT(r.test_accuracy, teacher_acc - 0.05);
  EXPECT_NEAR(rounds[1].test_accuracy, distill::ensemble_accuracy({rounds[1].student}, test),
              1e-12);
}

TEST(NoisyStudentCommand, RunsRoundsAndReportsEach) {
  testing::TempDir dir;
  testing::write_synthetic_mnist(dir.path(), 400, 100);
  const std::string cfg = testing::small_mlp_config(
      dir, dir.path(),
      "[noisy_student]\nrounds = 2\nlabelled = 100\npseudo_labels = \"soft\"\n"
      "confidence_threshold = 0.3\nbalance_classes = true\nteacher_epochs = 8\n"
      // The synthetic images encode the label in pixel columns: a shift or flip would change it.
      "crop_padding = 0\nflip = false\n");
  const std::string report = dir / "ns.json";
  const auto r = testing::run_hpm("distill " + cfg + " --report " + report);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(testing::read_text(report));
  EXPECT_EQ(j["method"], "noisy_student");
  ASSERT_EQ(j["rounds"].size(), 2u);
  EXPECT_EQ(j["labelled"], 100);
  EXPECT_EQ(j["unlabelled"], 300);
  EXPECT_GT(j["teacher_test_accuracy"].get<double>(), 0.5);
  EXPECT_GT(j["rounds"][1]["test_accuracy"].get<double>(), 0.5);
  EXPECT_EQ(j["student_test_accuracy"], j["rounds"][1]["test_accuracy"]);

  // A bad key names the file and line.
  const std::string bad =
      testing::small_mlp_config(dir, dir.path(), "[noisy_student]\npseudo_labels = \"medium\"\n");
  const auto e = testing::run_hpm("distill " + bad);
  EXPECT_NE(e.code, 0);
  EXPECT_NE(e.output.find("mlp.toml:"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("pseudo_labels"), std::string::npos) << e.output;
}

}  // namespace
}  // namespace hpm
