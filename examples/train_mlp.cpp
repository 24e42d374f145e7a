// hpm as a C++ library: the mlp of examples/fashion_mlp.toml, built and trained in code.
//   build/examples/train_mlp [/usr/share/datasets/fashion-mnist]
#include <cstdio>

#include "hpm/data/in_memory.h"
#include "hpm/nn/layers.h"
#include "hpm/optim/optimizer.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/trainer.h"

int main(int argc, char** argv) {
  using namespace hpm;
  const std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  set_num_threads(1);
  manual_seed(0);

  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(784, 512),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(512, 256),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(256, 10)});
  auto optimizer = std::make_shared<optim::SGD>(model->named_parameters(),
                                                optim::SgdOptions{.lr = 0.05f, .momentum = 0.9f});
  train::Trainer trainer(model, optimizer);
  trainer.add_callback(std::make_shared<train::ProgressCallback>(stdout, false, 1));

  const data::LabelledData train = data::load_mnist_split(dir, "train");
  const data::LabelledData test = data::load_mnist_split(dir, "t10k");
  train::FitOptions options;
  options.epochs = 1;
  options.batch_size = 64;
  const train::FitResult r = trainer.fit(train, &test, options);
  std::printf("test accuracy %.4f after %lld steps, %.0f samples/s\n",
              r.history.back().test_accuracy, static_cast<long long>(r.steps), r.samples_per_s());
  return 0;
}
