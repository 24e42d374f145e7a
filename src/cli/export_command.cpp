#include "hpm/cli/export_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "hpm/distribute/ps/checkpoint.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/paths.h"
#include "hpm/io/safetensors.h"
#include "hpm/tensor/kernels.h"
#include "hpm/train/checkpoint.h"

namespace hpm::cli {

CLI::App* add_export_command(CLI::App& app, ExportCommandOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("export", "a checkpoint's model weights as one safetensors file");
  cmd->add_option("checkpoint", o.checkpoint, "checkpoint root (follows latest) or ckpt-* dir")
      ->required();
  cmd->add_option("-o,--output", o.output, "the .safetensors file to write")->required();
  cmd->add_option("--dtype", o.dtype, "f32 (default), bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  return cmd;
}

int run_export(const ExportCommandOptions& o) {
  // A parameter-server job's checkpoint (manifest.json and shards), or a Trainer's.
  const std::string ps = distribute::ps::ps_checkpoint_dir(o.checkpoint);
  const std::string dir = ps.empty() ? train::resolve_checkpoint_dir(o.checkpoint) : ps;
  // Writing into a checkpoint would replace the weights being exported (or another checkpoint's,
  // or `latest`), which its recorded checksum then rejects: the checkpoint is lost.
  const std::string target = io::resolved_path(io::output_file_target(o.output));
  const std::filesystem::path parent = std::filesystem::path(target).parent_path();
  const bool in_this_one = io::path_within(target, dir);
  if (in_this_one || std::filesystem::exists(parent / "trainer_state.json") ||
      (std::filesystem::path(target).filename() == "latest" &&
       train::holds_checkpoints(parent.string()))) {
    throw std::invalid_argument("--output " + o.output + " is inside the checkpoint " +
                                (in_this_one ? dir : parent.string()) +
                                ": export to a file outside it");
  }
  io::NamedTensors out;
  const io::NamedTensors weights =
      ps.empty() ? train::load_checkpoint_weights(dir)
                 : distribute::ps::ps_checkpoint_weights(distribute::ps::read_ps_checkpoint(dir));
  for (const auto& [name, t] : weights) {
    if (t.dtype() != DType::F32 || o.dtype == "f32") {
      out.emplace_back(name, t);
    } else {
      out.emplace_back(name, o.dtype == "bf16" ? kernels::to_bf16(t) : kernels::to_f16(t));
    }
  }
  // The checkpoint's configuration travels with its weights: hpm evaluate --weights needs no
  // config file for them.
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  const std::map<std::string, std::string> recorded =
      ps.empty() ? train::read_checkpoint_state(dir).metadata
                 : distribute::ps::read_ps_checkpoint_metadata(dir);
  // And the tokenizer its ids mean: evaluate, init_from and teachers check it as they check a
  // checkpoint's (it was dropped, and weights read with another tokenizer were accepted).
  for (const char* key : {"config", "config_path", "tokenizer"}) {
    if (const auto it = recorded.find(key); it != recorded.end())
      metadata[std::string("hpm_") + key] = it->second;
  }
  io::save_safetensors(o.output, out, metadata);
  std::printf("exported %zu tensors of %s to %s (%s)\n", out.size(), dir.c_str(), o.output.c_str(),
              o.dtype.c_str());
  return 0;
}

}  // namespace hpm::cli
