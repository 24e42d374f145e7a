// MultiWorkerMirrored in real processes: two forked workers joined by gloo (a FileStore
// rendezvous) train the GPT and the ResNet 3 steps each and end with the one-device parameters
// (the ResNet against one device running the same two micro-batches: BatchNorm normalizes by the
// rows each replica sees). The workers write their parameters to files; the parent compares.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "common/models.h"
#include "common/temp_dir.h"
#include "common/training.h"
#include "hpm/comm/gloo.h"
#include "hpm/distribute/strategy.h"

namespace hpm::distribute {
namespace {

using namespace std::chrono_literals;

struct Case {
  const char* name;
  ModelFactory model;
  std::function<nn::Batch(std::uint64_t)> batch;
  std::shared_ptr<const nn::Objective> objective;
  int reference_micro_batches;
};

std::vector<float> train(Strategy& s, const Case& c) {
  s.scope(c.model, testing::sgd);
  for (int k = 0; k < 3; ++k) {
    if (!s.train_step(c.batch(100 + static_cast<std::uint64_t>(k)), *c.objective, 1.0f).finite) {
      throw std::runtime_error("a loss was not finite");
    }
  }
  return testing::flat_parameters(*s.model());
}

void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<std::size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

TEST(ModelsInProcesses, MultiWorkerMirroredOverGlooMatchesOneDevice) {
  const Case cases[] = {
      {"gpt", testing::tiny_gpt,
       [](std::uint64_t seed) { return testing::token_batch(8, 8, 32, seed); },
       std::make_shared<nn::LanguageModelling>(), 1},
      {"resnet", testing::tiny_resnet,
       [](std::uint64_t seed) { return testing::image_batch(8, seed); },
       std::make_shared<nn::Classification>(), 2},
  };
  // Every worker first, the references after: the parent forks before it has started any
  // threads (OpenMP's, oneDNN's), which a forked child could not use.
  hpm::testing::TempDir dir;
  for (const Case& c : cases) {
    std::vector<pid_t> workers;
    for (int rank = 0; rank < 2; ++rank) {
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::alarm(60);  // a hung worker dies rather than hanging the test
        int code = 0;
        try {
          comm::GlooOptions o;
          o.rank = rank;
          o.world_size = 2;
          o.rendezvous = dir / (std::string(c.name) + ".store");
          o.timeout = 30s;
          auto s = make_multi_worker_mirrored(comm::make_gloo_communicator(o), {});
          manual_seed(7);
          write_floats(dir / (std::string(c.name) + ".rank" + std::to_string(rank)), train(*s, c));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s worker %d: %s\n", c.name, rank, e.what());
          code = 1;
        }
        std::_Exit(code);
      }
      workers.push_back(pid);
    }
    for (pid_t pid : workers) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << c.name << " worker status " << status;
    }
  }
  for (const Case& c : cases) {
    StrategyOptions one;
    one.accumulation_steps = c.reference_micro_batches;
    manual_seed(7);
    const auto ref = train(*make_one_device(one), c);
    const auto w0 = read_floats(dir / (std::string(c.name) + ".rank0"));
    const auto w1 = read_floats(dir / (std::string(c.name) + ".rank1"));
    testing::expect_same_parameters(ref, w0, std::string(c.name) + " worker 0");
    EXPECT_EQ(w0, w1) << c.name << ": workers diverged";
  }
}

}  // namespace
}  // namespace hpm::distribute
