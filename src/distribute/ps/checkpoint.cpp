#include "hpm/distribute/ps/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "hpm/distribute/ps/cluster.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/crc32c.h"
#include "hpm/io/safetensors.h"

namespace hpm::distribute::ps {

namespace fs = std::filesystem;

std::string ps_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "manifest.json", ec)) return path;
  const fs::path latest = fs::path(path) / "latest";
  if (!fs::exists(latest, ec)) return "";
  std::string name = io::read_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const std::string dir = path + "/" + name;
  return fs::exists(fs::path(dir) / "manifest.json", ec) ? dir : "";
}

namespace {

nlohmann::json read_manifest(const std::string& manifest_path) {
  try {
    return nlohmann::json::parse(io::read_file(manifest_path));
  } catch (const std::exception& e) {
    throw PsError("checkpoint " + manifest_path + " is unreadable: " + e.what());
  }
}

std::map<std::string, std::string> metadata_of(const nlohmann::json& manifest) {
  return manifest.contains("metadata")
             ? manifest.at("metadata").get<std::map<std::string, std::string>>()
             : std::map<std::string, std::string>{};
}

}  // namespace

std::map<std::string, std::string> read_ps_checkpoint_metadata(const std::string& dir) {
  const std::string manifest_path = dir + "/manifest.json";
  const nlohmann::json m = read_manifest(manifest_path);
  try {
    return metadata_of(m);
  } catch (const std::exception& e) {
    throw PsError("checkpoint " + manifest_path + " is unreadable: " + e.what());
  }
}

PsCheckpoint read_ps_checkpoint(const std::string& dir) {
  PsCheckpoint c;
  c.dir = dir;
  const std::string manifest_path = dir + "/manifest.json";
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(io::read_file(manifest_path));
    c.next_task = m.at("next_task").get<std::int64_t>();
    c.redo = m.at("redo").get<std::vector<std::int64_t>>();
    c.metadata = metadata_of(m);
    c.mode = m.value("mode", "");
    c.parts = m.value("parts", std::int64_t{0});
    c.tasks_per_epoch = m.value("tasks_per_epoch", std::int64_t{0});
    for (const auto& s : m.at("shards")) {
      const std::string file = dir + "/" + s.at("file").get<std::string>();
      const std::string bytes = io::read_file(file);
      if (io::crc32c(bytes.data(), bytes.size()) != s.at("crc32c").get<std::uint32_t>())
        throw PsError("checkpoint shard " + file + " is corrupt (CRC32C mismatch)");
      io::SafetensorsFile f = io::decode_safetensors(bytes, file);
      for (auto& [name, t] : f.tensors) {
        if (name.rfind("optimizer/", 0) != 0) {
          c.variables[name] = t;
          continue;
        }
        // Every shard saves the optimizer's step; it is kept once, first.
        const std::string key = name.substr(10);
        if (key != "step") {
          c.optimizer_state.emplace_back(key, t);
        } else if (c.optimizer_state.empty() || c.optimizer_state.front().first != "step") {
          c.optimizer_state.insert(c.optimizer_state.begin(), {key, t});
        }
      }
      c.versions.push_back(s.at("version").get<std::int64_t>());
    }
  } catch (const PsError&) {
    throw;
  } catch (const std::exception& e) {
    throw PsError("checkpoint " + manifest_path + " is unreadable: " + e.what());
  }
  return c;
}

nn::NamedTensors ps_checkpoint_weights(const PsCheckpoint& checkpoint) {
  nn::NamedTensors out;
  for (const auto& [name, t] : checkpoint.variables)
    out.emplace_back(is_buffer_variable(name) ? name.substr(sizeof kBufferPrefix - 1) : name, t);
  return out;
}

void remove_ps_checkpoint(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool shard = n.rfind("shard-", 0) == 0 && n.find(".safetensors") != std::string::npos;
    if (shard || n.rfind("manifest.json", 0) == 0) fs::remove(e.path(), ec);
  }
  if (fs::is_empty(dir, ec) && !ec) fs::remove(dir, ec);
}

}  // namespace hpm::distribute::ps
