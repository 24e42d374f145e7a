// `hpm data bench|convert|inspect|tokenizer`: the input pipeline's tools.
#pragma once
#include <cstdint>
#include <string>

#include "hpm/cli/common_flags.h"
#include "hpm/cli/tokenizer_command.h"

namespace CLI {
class App;
}

namespace hpm::cli {

struct ConvertOptions {
  std::string dir = "/usr/share/datasets/fashion-mnist", out, compression = "none",
              image_format = "raw";
  int shards = 4;
};

struct DataCommandOptions {
  Common bench;  // hpm data bench CONFIG: the config's training pipeline alone, timed
  std::int64_t bench_epochs = 1;
  ConvertOptions convert;
  std::string inspect_file, inspect_compression = "none";
  TokenizerCommandOptions tokenizer;
  // Which subcommand the command line named (set by add_data_command).
  CLI::App *bench_cmd = nullptr, *convert_cmd = nullptr, *inspect_cmd = nullptr,
           *tokenizer_cmd = nullptr;
};

CLI::App* add_data_command(CLI::App& app, DataCommandOptions& options);
int run_data_command(const DataCommandOptions& options);

}  // namespace hpm::cli
