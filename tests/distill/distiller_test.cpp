// The distillation loss against a computation by hand, its gradient against finite differences,
// frozen teachers, multi-teacher soft targets, churn, and small end-to-end distillations.
#include "hpm/distill/distiller.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/blobs.h"
#include "hpm/autograd/gradcheck.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/losses.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

using distill::Distiller;
using distill::DistillOptions;
using distill::Teacher;

// A "teacher" whose logits are its inputs times a constant: soft targets known in closed form.
class Scale : public nn::Module {
 public:
  explicit Scale(float k) : k_(k) {}
  Tensor forward(const Tensor& x) override { return mul(x, k_); }
  std::string type_name() const override { return "Scale"; }

 private:
  float k_;
};

// softmax(row / T) in double.
std::vector<double> softmax_row(const float* z, int c, double t) {
  std::vector<double> p(c);
  double m = z[0] / t, s = 0;
  for (int j = 1; j < c; ++j) m = std::max(m, z[j] / t);
  for (int j = 0; j < c; ++j) s += p[j] = std::exp(z[j] / t - m);
  for (double& v : p) v /= s;
  return p;
}

// (1 - alpha) CE + alpha T^2 KL(p || q), p = sum_i w_i softmax(k_i z / T), q = softmax(s / T),
// batch means, by hand in double.
double loss_by_hand(const Tensor& s, const Tensor& z, const Tensor& y,
                    const std::vector<std::pair<float, double>>& scale_weight, double alpha,
                    double t) {
  const int n = static_cast<int>(s.size(0)), c = static_cast<int>(s.size(1));
  double ce = 0, kl = 0, wsum = 0;
  for (const auto& sw : scale_weight) wsum += sw.second;
  for (int i = 0; i < n; ++i) {
    const float* si = s.data<float>() + i * c;
    const auto q1 = softmax_row(si, c, 1.0);
    ce -= std::log(q1[y.data<std::int64_t>()[i]]);
    std::vector<double> p(c, 0.0);
    for (const auto& [k, w] : scale_weight) {
      std::vector<float> scaled(c);
      for (int j = 0; j < c; ++j) scaled[j] = k * z.data<float>()[i * c + j];
      const auto pk = softmax_row(scaled.data(), c, t);
      for (int j = 0; j < c; ++j) p[j] += w / wsum * pk[j];
    }
    const auto qt = softmax_row(si, c, t);
    for (int j = 0; j < c; ++j) kl += p[j] * (std::log(p[j]) - std::log(qt[j]));
  }
  return (1 - alpha) * ce / n + alpha * t * t * kl / n;
}

struct Case {
  Tensor student, inputs, labels;
};

Case small_case() {
  Generator gen(11);
  Case k;
  k.student = Tensor::randn({4, 5}, gen);
  k.inputs = Tensor::randn({4, 5}, gen, 0.0f, 2.0f);
  const std::int64_t y[] = {0, 3, 4, 1};
  k.labels = Tensor::from_i64(y, {4});
  return k;
}

// ---- the loss -----------------------------------------------------------------------------------

TEST(Distiller, LossEqualsWeightedCeAndScaledKlByHand) {
  const Case k = small_case();
  for (float alpha : {0.0f, 0.3f, 0.9f, 1.0f}) {
    for (float t : {1.0f, 2.0f, 4.0f}) {
      Distiller d({{std::make_shared<Scale>(1.0f), 1.0f}}, {alpha, t});
      const float got = d.loss(k.inputs, k.student, k.labels).item();
      const double want = loss_by_hand(k.student, k.inputs, k.labels, {{1.0f, 1.0}}, alpha, t);
      EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want))) << alpha << " " << t;
    }
  }
}

// With one teacher the soft-target loss is nn::distillation_loss, which tests/golden checks
// against PyTorch (the T^2 factor and the KL direction).
TEST(Distiller, OneTeacherMatchesGoldenTestedNnLoss) {
  const Case k = small_case();
  Distiller d({{std::make_shared<Scale>(1.0f), 1.0f}}, {0.7f, 3.0f});
  const float mine = d.loss(k.inputs, k.student, k.labels).item();
  const float nn_loss = nn::distillation_loss(k.student, k.inputs, k.labels, 0.7f, 3.0f).item();
  EXPECT_NEAR(mine, nn_loss, 1e-6f * std::max(1.0f, std::abs(nn_loss)));
}

TEST(Distiller, GradientMatchesFiniteDifferences) {
  const Case k = small_case();
  Distiller d({{std::make_shared<Scale>(1.0f), 1.0f}, {std::make_shared<Scale>(-0.5f), 2.0f}},
              {0.6f, 2.0f});
  Tensor s = k.student.clone();
  s.set_requires_grad(true);
  const auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return d.loss(k.inputs, in[0], k.labels); }, {s});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Distiller, MultiTeacherTargetsAreWeightedAverageOfProbabilities) {
  const Case k = small_case();
  const float t = 2.0f;
  Distiller d({{std::make_shared<Scale>(1.0f), 1.0f}, {std::make_shared<Scale>(3.0f), 3.0f}},
              {0.5f, t});
  const Tensor p = d.soft_targets(k.inputs);
  ASSERT_EQ(p.shape(), k.inputs.shape());
  for (int i = 0; i < 4; ++i) {
    std::vector<float> z3(5);
    const float* z = k.inputs.data<float>() + i * 5;
    for (int j = 0; j < 5; ++j) z3[j] = 3.0f * z[j];
    const auto p1 = softmax_row(z, 5, t), p3 = softmax_row(z3.data(), 5, t);
    for (int j = 0; j < 5; ++j)
      EXPECT_NEAR(p.data<float>()[i * 5 + j], 0.25 * p1[j] + 0.75 * p3[j], 1e-6);
  }
  EXPECT_FALSE(p.requires_grad());
  const double want =
      loss_by_hand(k.student, k.inputs, k.labels, {{1.0f, 1.0}, {3.0f, 3.0}}, 0.5, t);
  EXPECT_NEAR(d.loss(k.inputs, k.student, k.labels).item(), want, 1e-5 * std::max(1.0, want));
}

// Counts the rows it is run on.
class CountingScale : public Scale {
 public:
  using Scale::Scale;
  Tensor forward(const Tensor& x) override {
    rows += x.size(0);
    return Scale::forward(x);
  }
  std::int64_t rows = 0;
};

TEST(Distiller, CachedTargetsAreTheSameAndSkipTheTeachers) {
  Generator gen(4);
  const Tensor x = Tensor::randn({6, 5}, gen);
  auto teacher = std::make_shared<CountingScale>(1.5f);
  Distiller plain({{teacher, 1.0f}}, {0.5f, 2.0f});
  Distiller cached({{teacher, 1.0f}}, {0.5f, 2.0f, true});
  const Tensor want = plain.soft_targets(x);
  teacher->rows = 0;
  const auto same = [&](const Tensor& got, const Tensor& ref) {
    ASSERT_EQ(got.shape(), ref.shape());
    for (std::int64_t i = 0; i < ref.numel(); ++i)
      EXPECT_EQ(got.data<float>()[i], ref.data<float>()[i]) << i;
  };
  same(cached.soft_targets(x), want);
  EXPECT_EQ(teacher->rows, 6);
  same(cached.soft_targets(x), want);  // all hits
  EXPECT_EQ(teacher->rows, 6);
  // Rows 4, 5 and 0 again, in another order, and one new row: only the new one runs.
  Tensor mixed = Tensor::empty({4, 5});
  const std::int64_t order[] = {4, 5, 0};
  for (int j = 0; j < 3; ++j) mixed.narrow(j, 1).copy_(x.narrow(order[j], 1));
  mixed.narrow(3, 1).copy_(Tensor::randn({1, 5}, gen));
  const Tensor got = cached.soft_targets(mixed);
  EXPECT_EQ(teacher->rows, 7);
  same(got, plain.soft_targets(mixed));
  EXPECT_EQ(cached.cache_hits(), 9);
  EXPECT_EQ(cached.cache_misses(), 7);
}

TEST(Distiller, RejectsBadSettings) {
  auto m = std::make_shared<Scale>(1.0f);
  EXPECT_THROW(Distiller({}, {}), std::invalid_argument);
  EXPECT_THROW(Distiller({{m, 1.0f}}, {1.5f, 2.0f}), std::invalid_argument);
  EXPECT_THROW(Distiller({{m, 1.0f}}, {0.5f, 0.0f}), std::invalid_argument);
  EXPECT_THROW(Distiller({{m, -1.0f}}, {0.5f, 2.0f}), std::invalid_argument);
  EXPECT_THROW(Distiller({{m, 0.0f}}, {0.5f, 2.0f}), std::invalid_argument);
}

// ---- training -----------------------------------------------------------------------------------

std::shared_ptr<nn::Sequential> mlp(std::int64_t hidden, bool with_noise_layers) {
  std::vector<std::shared_ptr<nn::Module>> layers{std::make_shared<nn::Linear>(8, hidden)};
  if (with_noise_layers)
    layers.push_back(std::make_shared<nn::BatchNorm1d>(nn::BatchNormOptions{hidden}));
  layers.push_back(std::make_shared<nn::ReLU>());
  if (with_noise_layers) layers.push_back(std::make_shared<nn::Dropout>(0.3f));
  layers.push_back(std::make_shared<nn::Linear>(hidden, 3));
  return std::make_shared<nn::Sequential>(layers);
}

std::shared_ptr<optim::Optimizer> distiller_sgd(nn::Module& m) {
  return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.05f, 0.9f});
}

train::FitOptions distiller_fit_options(std::int64_t epochs) {
  train::FitOptions o;
  o.epochs = epochs;
  o.batch_size = 32;
  o.seed = 5;
  return o;
}

std::shared_ptr<nn::Sequential> trained_teacher(const data::LabelledData& train, std::uint64_t seed,
                                                bool with_noise_layers) {
  manual_seed(seed);
  auto teacher = mlp(32, with_noise_layers);
  train::Trainer t(teacher, distiller_sgd(*teacher));
  t.fit(train, nullptr, distiller_fit_options(4));
  return teacher;
}

// Every parameter and buffer, as bytes.
std::vector<std::vector<unsigned char>> snapshot(const nn::Module& m) {
  std::vector<std::vector<unsigned char>> out;
  for (const auto& [name, t] : m.state_dict()) {
    const auto* b = static_cast<const unsigned char*>(t.raw_data());
    out.emplace_back(b, b + t.nbytes());
  }
  return out;
}

TEST(Distiller, TeacherIsBitIdenticalAfterDistillation) {
  const auto train = testing::blobs(512, 1);
  // Dropout and batch norm: in training mode they would draw noise and move running statistics.
  auto teacher = trained_teacher(train, 2, true);
  teacher->train();      // the Distiller must switch it to evaluation mode itself
  teacher->zero_grad();  // drop the gradients of its own training: none may come back
  const auto before = snapshot(*teacher);

  manual_seed(3);
  auto student = mlp(16, false);
  train::Trainer trainer(student, distiller_sgd(*student));
  distill::attach(trainer, std::make_shared<Distiller>(std::vector<Teacher>{{teacher, 1.0f}},
                                                       DistillOptions{0.9f, 4.0f}));
  trainer.fit(train, nullptr, distiller_fit_options(2));

  EXPECT_EQ(snapshot(*teacher), before);
  EXPECT_FALSE(teacher->is_training());
  for (const auto& p : teacher->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Distiller, DistilledStudentLearnsAndMOnMEnsembleIsEvaluated) {
  const auto train = testing::blobs(768, 1), test = testing::blobs(400, 9);
  auto teacher_a = trained_teacher(train, 2, false), teacher_b = trained_teacher(train, 4, false);
  const double acc_a = distill::ensemble_accuracy({teacher_a}, test);
  EXPECT_GT(acc_a, 0.8);

  // Two teachers, one student; soft targets alone (alpha = 1) must teach it the task.
  manual_seed(6);
  auto student = mlp(16, false);
  train::Trainer trainer(student, distiller_sgd(*student));
  distill::attach(trainer, std::make_shared<Distiller>(
                               std::vector<Teacher>{{teacher_a, 1.0f}, {teacher_b, 1.0f}},
                               DistillOptions{1.0f, 2.0f}));
  trainer.fit(train, nullptr, distiller_fit_options(3));
  EXPECT_GT(trainer.evaluate(test).accuracy, acc_a - 0.08);

  // M on M: a student per teacher, then their ensemble.
  manual_seed(7);
  const auto students = distill::distill_one_per_teacher(
      {{teacher_a, 1.0f}, {teacher_b, 1.0f}}, {[] { return mlp(16, false); }, distiller_sgd},
      data::Dataset::batched_slices({train.inputs, train.labels}, 32, true, 5, true),
      distiller_fit_options(3), {0.5f, 2.0f});
  ASSERT_EQ(students.size(), 2u);
  EXPECT_GT(distill::ensemble_accuracy(students, test), acc_a - 0.08);
}

TEST(Distiller, EnsembleAveragesProbabilities) {
  // Row 0: A is sure of class 0, B mildly prefers class 1: the average keeps class 0.
  const Tensor x = Tensor::from({4.0f, 0.0f}, {1, 2});
  auto a = std::make_shared<Scale>(1.0f), b = std::make_shared<Scale>(-0.1f);
  const Tensor p = distill::ensemble_probabilities({a, b}, x);
  const double pa0 = 1.0 / (1.0 + std::exp(-4.0)), pb0 = 1.0 / (1.0 + std::exp(0.4));
  EXPECT_NEAR(p.data<float>()[0], (pa0 + pb0) / 2, 1e-6);
  EXPECT_NEAR(p.data<float>()[1], 1 - (pa0 + pb0) / 2, 1e-6);
}

// The ensemble's score against the closed form: the NLL of the labels under the averaged
// probabilities, and the top-1 of that average; one teacher scores as its own cross-entropy.
TEST(Distiller, EnsembleScoreIsTheAverageProbabilitiesNllAndTop1) {
  const data::LabelledData d{Tensor::from({4.0f, 0.0f, 0.0f, 1.0f, 2.0f, 3.0f}, {3, 2}),
                             Tensor::from_i64(std::vector<std::int64_t>{0, 0, 1}, {3})};
  auto a = std::make_shared<Scale>(1.0f), b = std::make_shared<Scale>(-0.1f);
  const distill::EnsembleScore s = distill::evaluate_ensemble({{a, 1.0f}, {b, 1.0f}}, d, 2);
  double nll = 0;
  int correct = 0;
  const std::int64_t labels[] = {0, 0, 1};
  for (int i = 0; i < 3; ++i) {
    const float* z = d.inputs.data<float>() + 2 * i;
    const float zb[2] = {-0.1f * z[0], -0.1f * z[1]};
    const auto pa = softmax_row(z, 2, 1.0), pb = softmax_row(zb, 2, 1.0);
    const double p0 = (pa[0] + pb[0]) / 2, p1 = (pa[1] + pb[1]) / 2;
    nll -= std::log(labels[i] == 0 ? p0 : p1);
    correct += (p1 > p0) == (labels[i] == 1);
  }
  EXPECT_EQ(s.rows, 3);
  EXPECT_NEAR(s.loss, nll / 3, 1e-6);
  EXPECT_DOUBLE_EQ(s.accuracy, correct / 3.0);
  const distill::EnsembleScore one = distill::evaluate_ensemble({{a, 1.0f}}, d);
  EXPECT_NEAR(one.loss, cross_entropy(d.inputs, d.labels).item(), 1e-6);
}

// ---- churn --------------------------------------------------------------------------------------

TEST(Churn, SplitsDisagreementsIntoGoodAndBad) {
  // Top-1 of A and B per row (labels in brackets):
  //   0: A 0, B 0 [0]  agree            1: A 1, B 2 [2]  good (A wrong, B right)
  //   2: A 2, B 0 [2]  bad              3: A 0, B 1 [2]  both wrong, still churn
  //   4: A 1, B 1 [0]  agree (wrong)
  const Tensor a = Tensor::from({9, 0, 0, 0, 9, 0, 0, 0, 9, 9, 0, 0, 0, 9, 0}, {5, 3});
  const Tensor b = Tensor::from({9, 0, 0, 0, 0, 9, 9, 0, 0, 0, 9, 0, 0, 9, 0}, {5, 3});
  const std::int64_t y[] = {0, 2, 2, 2, 0};
  const auto c = distill::churn(a, b, Tensor::from_i64(y, {5}));
  EXPECT_EQ(c.examples, 5);
  EXPECT_DOUBLE_EQ(c.churn, 3.0 / 5);
  EXPECT_DOUBLE_EQ(c.good_churn, 1.0 / 5);
  EXPECT_DOUBLE_EQ(c.bad_churn, 1.0 / 5);
  const auto self = distill::churn(a, a, Tensor::from_i64(y, {5}));
  EXPECT_EQ(self.churn, 0.0);
  EXPECT_THROW(distill::churn(a, Tensor::zeros({4, 3}), Tensor::from_i64(y, {5})), std::exception);
}

}  // namespace
}  // namespace hpm
