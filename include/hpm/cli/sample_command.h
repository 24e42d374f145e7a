// `hpm sample CONFIG --checkpoint DIR`: text from a trained GPT, printed as it is drawn. The
// prompt goes through the model once; each new token then costs one position, its keys and values
// kept in a cache (nn::KVCache), where re-running the window would cost block_size positions.
// --no-cache re-runs the window instead, for the comparison. Text goes through the config's
// [data] tokenizer (bytes by default): the prompt is encoded with it (a prompt it cannot encode
// without <unk> is refused, naming the characters) and the drawn ids are decoded as they come, a
// character printed once all its bytes are drawn.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hpm::cli {

struct SampleCommandOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string checkpoint;
  std::string prompt = "\n";
  std::int64_t tokens = 200;
  float temperature = 0.8f;
  std::int64_t top_k = 0;  // 0: every token
  std::int64_t seed = 0;
  int threads = 1;
  std::string device;  // overrides [train] device: the model and its key/value cache live there
  bool no_cache = false;
  std::string report;
};

CLI::App* add_sample_command(CLI::App& app, SampleCommandOptions& options);
int run_sample(SampleCommandOptions options);

}  // namespace hpm::cli
