// Running the `hpm` binary from tests: a command's exit code and output, and a small synthetic
// Fashion-MNIST-shaped data set with a config that trains on it in well under a second.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/temp_dir.h"
#include "hpm/io/idx.h"
#include "hpm/tensor/random.h"

namespace hpm::testing {

struct CommandResult {
  int code;            // exit status; -1 when killed by a signal
  std::string output;  // stdout and stderr
};

// Runs COMMAND with the shell, stderr joined to stdout.
inline CommandResult run_shell(const std::string& command) {
  FILE* p = popen(("(" + command + ") 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline std::string hpm_binary() { return std::string(HPM_BINARY_DIR) + "/hpm"; }

// `hpm ARGS`.
inline CommandResult run_hpm(const std::string& args) {
  return run_shell(hpm_binary() + " " + args);
}

// Images whose brightness pattern encodes the label: learnable in a few steps.
inline void write_synthetic_mnist(const std::string& dir, std::int64_t n_train,
                                  std::int64_t n_test) {
  Generator gen(3);
  for (auto [split, n] : {std::pair{"train", n_train}, std::pair{"t10k", n_test}}) {
    io::IdxArray images{io::kIdxU8, {n, 28, 28}, {}}, labels{io::kIdxU8, {n}, {}};
    for (std::int64_t i = 0; i < n; ++i) {
      const auto label = static_cast<unsigned char>(gen.below(10));
      labels.data.push_back(label);
      for (int k = 0; k < 784; ++k)
        images.data.push_back(static_cast<unsigned char>((k % 10 == label ? 200 : 20) +
                                                         static_cast<int>(gen.below(40))));
    }
    io::write_idx(dir + "/" + split + "-images-idx3-ubyte.gz", images, true);
    io::write_idx(dir + "/" + split + "-labels-idx1-ubyte.gz", labels, true);
  }
}

// A small mlp on `data_dir`, batch 16, SGD with momentum; `extra` is appended (more sections).
inline std::string small_mlp_config(const TempDir& dir, const std::string& data_dir,
                                    const std::string& extra = "") {
  const std::string path = dir / "mlp.toml";
  std::ofstream(path)
      << "[model]\nlayers = [{ type = \"flatten\" }, { type = \"linear\", in = 784, "
         "out = 32 }, { type = \"relu\" }, { type = \"linear\", in = 32, out = 10 }]\n"
      << "[data]\ndir = \"" << data_dir << "\"\nbatch_size = 16\n"
      << "[optimizer]\nkind = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
      << "[train]\nepochs = 2\n"
      << extra;
  return path;
}

// Three small text files text0.txt .. text2.txt in `dir` for byte-level language models: 600
// words each from a vocabulary of ten, in a pattern a tiny GPT learns within a hundred steps.
inline void write_word_files(const TempDir& dir) {
  const char* words[] = {"the ", "cat ", "sat ", "on ",  "a ",
                         "mat ", "and ", "dog ", "ran ", "far. "};
  for (int f = 0; f < 3; ++f) {
    std::string text;
    for (int i = 0; i < 600; ++i) text += words[(i * 7 + f * 3 + i / 5) % 10];
    std::ofstream(dir / ("text" + std::to_string(f) + ".txt")) << text;
  }
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A number from a JSON report.
inline double report_number(const std::string& path, const char* key) {
  return nlohmann::json::parse(read_text(path))[key].get<double>();
}

}  // namespace hpm::testing
