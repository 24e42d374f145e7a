// Golden tests: every layer, loss and optimizer against values PyTorch computed
// (tests/golden/generate.py, fixtures committed). Tolerances are stated per comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hpm/io/safetensors.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/losses.h"
#include "hpm/optim/optimizer.h"
#include "hpm/optim/schedule.h"

namespace hpm {
namespace {

using json = nlohmann::json;

struct Fixture {
  io::SafetensorsFile file;
  json config;
  const Tensor& operator[](const std::string& name) const { return file.at(name); }
  bool has(const std::string& name) const { return file.contains(name); }
};

Fixture load(const std::string& name) {
  Fixture f;
  f.file = io::load_safetensors(std::string(HPM_SOURCE_DIR) + "/tests/golden/fixtures/" + name +
                                ".safetensors");
  f.config = json::parse(f.file.metadata.at("config"));
  return f;
}

// |actual - expected| <= atol + rtol * |expected| element-wise.
void expect_close(const Tensor& actual, const Tensor& expected, float atol, float rtol,
                  const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.numel(), expected.numel()) << what << ": " << actual.shape().str() << " vs "
                                              << expected.shape().str();
  const float* a = actual.data<float>();
  const float* e = expected.data<float>();
  for (std::int64_t i = 0; i < actual.numel(); ++i) {
    ASSERT_LE(std::fabs(a[i] - e[i]), atol + rtol * std::fabs(e[i]))
        << what << " element " << i << ": hpm " << a[i] << " vs torch " << e[i];
  }
}

std::shared_ptr<nn::Module> make_layer(const json& c) {
  const std::string kind = c.at("kind");
  if (kind == "linear") {
    return std::make_shared<nn::Linear>(c.at("in_features"), c.at("out_features"), c.at("bias"));
  }
  if (kind == "conv2d") {
    nn::Conv2dOptions o{c.at("in_channels"), c.at("out_channels"), c.at("kernel_size"),
                        c.at("stride"), c.at("padding"), c.at("bias")};
    return std::make_shared<nn::Conv2d>(o);
  }
  if (kind == "maxpool2d") return std::make_shared<nn::MaxPool2d>(c.at("kernel_size"), c.at("stride"), c.at("padding"));
  if (kind == "avgpool2d") {
    return std::make_shared<nn::AvgPool2d>(c.at("kernel_size"), c.at("stride"), c.at("padding"),
                                           c.at("count_include_pad"));
  }
  if (kind == "global_avgpool") return std::make_shared<nn::GlobalAvgPool2d>();
  if (kind == "flatten") return std::make_shared<nn::Flatten>();
  if (kind == "relu") return std::make_shared<nn::ReLU>();
  if (kind == "gelu") return std::make_shared<nn::GELU>(c.at("approximate") == "tanh");
  if (kind == "tanh") return std::make_shared<nn::Tanh>();
  if (kind == "sigmoid") return std::make_shared<nn::Sigmoid>();
  if (kind == "dropout") return std::make_shared<nn::Dropout>(c.at("p").get<float>());
  if (kind == "batchnorm1d" || kind == "batchnorm2d") {
    nn::BatchNormOptions o;
    o.num_features = c.at("num_features");
    o.eps = c.at("eps");
    o.momentum = c.at("momentum");
    if (kind == "batchnorm1d") return std::make_shared<nn::BatchNorm1d>(o);
    return std::make_shared<nn::BatchNorm2d>(o);
  }
  if (kind == "layernorm") {
    return std::make_shared<nn::LayerNorm>(Shape(c.at("normalized_shape").get<std::vector<std::int64_t>>()),
                                           c.at("eps").get<float>());
  }
  if (kind == "embedding") return std::make_shared<nn::Embedding>(c.at("num_embeddings"), c.at("embedding_dim"));
  return nullptr;
}

// Forward and backward of one layer against torch; parameters and buffers loaded from the fixture.
void check_layer(const std::string& name) {
  SCOPED_TRACE(name);
  Fixture f = load(name);
  std::shared_ptr<nn::Module> layer = make_layer(f.config);
  ASSERT_TRUE(layer) << "no layer for kind " << f.config.at("kind");
  if (f.config.contains("training") && !f.config.at("training").get<bool>()) layer->eval();
  for (auto& [pname, p] : layer->named_parameters()) p.copy_(f["param." + pname]);
  for (auto& [bname, b] : layer->named_buffers()) b.copy_(f["buffer_before." + bname]);

  Tensor input = f["input"].clone();
  if (input.dtype() == DType::F32) input.set_requires_grad(true);
  Tensor out = layer->forward(input);
  expect_close(out, f["output"], 1e-5f, 1e-5f, "output");
  out.backward(f["grad_output"]);
  if (f.has("grad.input")) expect_close(input.grad(), f["grad.input"], 1e-5f, 1e-4f, "grad.input");
  for (auto& [pname, p] : layer->named_parameters())
    expect_close(p.grad(), f["grad.param." + pname], 1e-5f, 1e-4f, "grad." + pname);
  for (auto& [bname, b] : layer->named_buffers()) {
    if (b.dtype() == DType::I64) {
      EXPECT_EQ(b.item(), f["buffer." + bname].item()) << bname;
    } else {
      expect_close(b, f["buffer." + bname], 1e-6f, 1e-5f, "buffer." + bname);
    }
  }
}

TEST(Golden, Layers) {
  for (const char* name :
       {"linear", "linear_nobias", "conv2d", "conv2d_stride2", "conv2d_nobias", "conv2d_1x1",
        "maxpool2d", "maxpool2d_k3s2p1", "avgpool2d", "avgpool2d_k3s1p1", "global_avgpool",
        "flatten", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "batchnorm1d", "batchnorm2d",
        "batchnorm2d_eval", "layernorm", "layernorm_2d", "embedding", "dropout_eval"}) {
    check_layer(name);
  }
}

TEST(Golden, Softmax) {
  for (const char* name : {"softmax", "log_softmax"}) {
    SCOPED_TRACE(name);
    Fixture f = load(name);
    Tensor x = f["input"].clone();
    x.set_requires_grad(true);
    Tensor y = std::string(name) == "softmax" ? softmax(x, f.config.at("dim")) : log_softmax(x, f.config.at("dim"));
    expect_close(y, f["output"], 1e-6f, 1e-5f, "output");
    y.backward(f["grad_output"]);
    expect_close(x.grad(), f["grad.input"], 1e-6f, 1e-4f, "grad.input");
  }
}

// Scalar losses: value and d loss / d input.
void check_loss(const std::string& name, const std::function<Tensor(const Fixture&, const Tensor&)>& loss) {
  SCOPED_TRACE(name);
  Fixture f = load(name);
  Tensor x = f["input"].clone();
  x.set_requires_grad(true);
  Tensor l = loss(f, x);
  expect_close(l, f["output"], 1e-6f, 1e-5f, "loss");
  l.backward();
  expect_close(x.grad(), f["grad.input"], 1e-7f, 1e-4f, "grad.input");
}

TEST(Golden, Losses) {
  check_loss("cross_entropy", [](const Fixture& f, const Tensor& x) { return cross_entropy(x, f["target"]); });
  check_loss("cross_entropy_smooth", [](const Fixture& f, const Tensor& x) {
    return cross_entropy(x, f["target"], f.config.at("label_smoothing").get<float>());
  });
  check_loss("nll", [](const Fixture& f, const Tensor& x) { return nll_loss(x, f["target"]); });
  check_loss("mse", [](const Fixture& f, const Tensor& x) { return mse_loss(x, f["target"]); });
  check_loss("kl_div", [](const Fixture& f, const Tensor& x) { return kl_div(log_softmax(x), f["target"]); });
}

TEST(Golden, DistillationLosses) {
  // The T^2 factor and the KL direction KL(teacher || student) are what these pin down.
  check_loss("distill_kd", [](const Fixture& f, const Tensor& x) {
    return nn::distillation_kl(x, f["teacher"], f.config.at("temperature").get<float>());
  });
  check_loss("distill_combined", [](const Fixture& f, const Tensor& x) {
    return nn::distillation_loss(x, f["teacher"], f["target"], f.config.at("alpha").get<float>(),
                                 f.config.at("temperature").get<float>());
  });
}

// Ten optimizer steps with grad = a * w + b, as the generator computed them.
void check_optimizer(const std::string& name) {
  SCOPED_TRACE(name);
  Fixture f = load(name);
  const json& c = f.config;
  Tensor w = f["init"].clone();
  w.set_requires_grad(true);
  optim::NamedTensors params{{"w", w}};
  std::unique_ptr<optim::Optimizer> opt;
  const std::string kind = c.at("kind");
  if (kind == "sgd") {
    opt = std::make_unique<optim::SGD>(params, optim::SgdOptions{c.at("lr"), c.at("momentum"), c.at("dampening"),
                                                                 c.at("weight_decay"), c.at("nesterov")});
  } else {
    optim::AdamOptions o{c.at("lr"), c.at("betas")[0], c.at("betas")[1], c.at("eps"),
                         c.at("weight_decay"), c.at("amsgrad"), false};
    if (kind == "adamw") opt = std::make_unique<optim::AdamW>(params, o);
    else opt = std::make_unique<optim::Adam>(params, o);
  }
  const Tensor& a = f["a"];
  const Tensor& b = f["b"];
  for (int step = 1; step <= c.at("steps").get<int>(); ++step) {
    Tensor g = Tensor::empty(w.shape());
    for (std::int64_t i = 0; i < w.numel(); ++i)
      g.data<float>()[i] = a.data<float>()[i] * w.data<float>()[i] + b.data<float>()[i];
    w.set_grad(g);
    opt->step();
    expect_close(w, f["step." + std::to_string(step)], 1e-6f, 1e-5f, "step " + std::to_string(step));
  }
}

TEST(Golden, Optimizers) {
  for (const char* name : {"sgd", "sgd_momentum", "sgd_nesterov", "sgd_weight_decay", "adam",
                           "adam_weight_decay", "adam_amsgrad", "adamw"}) {
    check_optimizer(name);
  }
}

TEST(Golden, Schedules) {
  Fixture f = load("schedules");
  const json& c = f.config;
  const float base = c.at("base_lr");
  optim::StepLr step(c["step_lr"]["step_size"], c["step_lr"]["gamma"]);
  optim::CosineLr cosine(c["cosine"]["T_max"], c["cosine"]["eta_min"]);
  optim::WarmupLr warmup(c["warmup_linear"]["start_factor"], c["warmup_linear"]["total_iters"]);
  for (std::int64_t t = 0; t < c.at("steps").get<std::int64_t>(); ++t) {
    EXPECT_NEAR(step.lr(base, t), f["step_lr"].data<float>()[t], 1e-7) << "step_lr t=" << t;
    EXPECT_NEAR(cosine.lr(base, t), f["cosine"].data<float>()[t], 1e-6) << "cosine t=" << t;
    EXPECT_NEAR(warmup.lr(base, t), f["warmup_linear"].data<float>()[t], 1e-6) << "warmup t=" << t;
  }
}

TEST(Golden, ClipGradNorm) {
  Fixture f = load("clip_grad_norm");
  std::vector<Tensor> params;
  for (int i = 0; i < 3; ++i) {
    Tensor p = Tensor::zeros(f["grad." + std::to_string(i)].shape());
    p.set_requires_grad(true);
    p.set_grad(f["grad." + std::to_string(i)].clone());
    params.push_back(p);
  }
  const float norm = optim::clip_grad_norm(params, f.config.at("max_norm"));
  EXPECT_NEAR(norm, f["total_norm"].item(), 1e-5);
  for (int i = 0; i < 3; ++i)
    expect_close(params[static_cast<std::size_t>(i)].grad(), f["clipped." + std::to_string(i)], 1e-7f, 1e-5f,
                 "clipped." + std::to_string(i));
}

}  // namespace
}  // namespace hpm
