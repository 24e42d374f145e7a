// `hpm export CHECKPOINT -o FILE.safetensors [--dtype f32|bf16|f16]`: a checkpoint's model weights
// as one safetensors file, the way PyTorch's `load_file` + `load_state_dict` read them (a tied
// weight under each of its names, as in torch's state_dict), optionally in half precision
// (rounded to nearest even; integer buffers stay as they are). Written atomically. Reading back
// (`[model] init_from`, `hpm evaluate --weights`, teachers) casts F16, BF16 and F64 to f32.
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace hpm::cli {

struct ExportCommandOptions {
  std::string checkpoint;
  std::string output;
  std::string dtype = "f32";
};

CLI::App* add_export_command(CLI::App& app, ExportCommandOptions& options);
int run_export(const ExportCommandOptions& options);

}  // namespace hpm::cli
