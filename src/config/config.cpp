// The run configuration: reads the TOML file, applies the --set overrides, checks that every
// section is one hpm knows, and reads each through its own schema (src/cli/config/: one file per
// section with its builders, all through one reader, so every error says where and what).
#include "hpm/config/config.h"

#include <sched.h>
#include <toml++/toml.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "config/reader.h"
#include "config/sections.h"
#include "hpm/distribute/ps/checkpoint.h"
#include "hpm/io/safetensors.h"
#include "hpm/train/checkpoint.h"

namespace hpm::config {

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

void use_threads(int threads) {
  warn_if_oversubscribed(threads);
  set_num_threads(threads);
  Device::cpu().set_threads(threads);
}

void warn_if_oversubscribed(int threads) {
  const int cpus = available_cpus();
  if (threads <= cpus) return;
  std::fprintf(stderr,
               "hpm: warning: %d threads on %d available CPU(s): threads beyond the CPUs wait for "
               "one another and run slower; set [train] threads (or --threads) to at most %d\n",
               threads, cpus, cpus);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  // Read here rather than by toml::parse_file, which cannot read a pipe (/dev/stdin, <(...)) and
  // parses a directory as an empty file (then "missing [model] section").
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(path + ": is a directory, not a config file (give the .toml file in it)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(path + ": cannot read: " + std::strerror(errno));
  return load_config_text(text.str(), path, overrides);
}

Config load_config_text(const std::string& text, const std::string& path,
                        const std::vector<std::string>& overrides) {
  using namespace detail;
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << where(path, e.source()) << ": " << e.description();
    throw ConfigError(os.str());
  }
  clear_overrides();
  for (const auto& o : overrides) apply_override(root, o);

  Config c;
  c.path = path;
  {
    std::ostringstream resolved;
    resolved << root;
    c.resolved = resolved.str();
  }
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    c.given[key] = where(path, v);
    if (const toml::table* t = v.as_table()) {
      for (const auto& [tk, tv] : *t) c.given[key + "." + std::string(tk.str())] = where(path, tv);
    }
    static const std::set<std::string> sections = {
        "model",   "data",          "optimizer", "schedule", "train",  "strategy", "early_stopping",
        "distill", "noisy_student", "codistill", "pipeline", "memory", "cluster",  "ps"};
    if (!sections.count(key)) {
      throw ConfigError(where(path, k.source()) + ": unknown section [" + key +
                        "] (known: cluster, codistill, data, distill, early_stopping, memory, "
                        "model, noisy_student, optimizer, pipeline, ps, schedule, strategy, "
                        "train)");
    }
  }
  const Source s{path, root};
  read_model(s, c);
  read_data(s, c);
  read_optimizer(s, c);
  read_schedule(s, c);
  read_train(s, c);
  read_memory(s, c);
  read_strategy(s, c);
  read_pipeline(s, c);
  read_early_stopping(s, c);
  read_distill(s, c);
  read_noisy_student(s, c);
  read_codistill(s, c);
  read_ps(s, c);
  return c;
}

void refuse_device_but_cpu(const Config& config, const std::string& command,
                           const std::string& why) {
  if (config.device == "cpu") return;
  refuse_setting(config, "train", "device",
                 "= \"" + config.device + "\" is not applied by " + command + " yet: " + why);
}

void refuse_train_only_settings(const Config& config, const std::string& command) {
  const std::string why = "is not applied by " + command + " (only hpm train runs it)";
  if (config.early_stopping) refuse_setting(config, "early_stopping", "", why);
  if (!config.best_checkpoint_dir.empty())
    refuse_setting(config, "train", "best_checkpoint_dir", why);
  if (config.device_budget_mb > 0) refuse_setting(config, "memory", "device_budget_mb", why);
}

namespace {

// The [model] table of a resolved configuration.
toml::table model_table(const std::string& resolved) {
  const toml::table root = toml::parse(resolved);
  if (const toml::table* m = root["model"].as_table()) return *m;
  return {};
}

std::string toml_text(const toml::node& node) {
  std::ostringstream os;
  node.visit([&os](const auto& v) { os << v; });
  return os.str();
}

// Every [model] key that `config` and the checkpoint's configuration both set, to different values
// (dropout aside), is refused: the weights are the checkpoint's.
void check_against_checkpoint(const Config& config, const std::string& recorded,
                              const std::string& source) {
  const toml::table mine = model_table(config.resolved), theirs = model_table(recorded);
  for (const auto& [key, value] : mine) {
    const std::string k(key.str());
    const toml::node* other = theirs.get(k);
    if (k == "dropout" || other == nullptr || toml_text(value) == toml_text(*other)) continue;
    const auto at = config.given.find("model." + k);
    throw ConfigError((at != config.given.end() ? at->second : config.path) + ": [model] " + k +
                      " = " + toml_text(value) + " contradicts " + source + ", whose model has " +
                      k + " = " + toml_text(*other));
  }
}

// The configuration of a command reading weights that recorded theirs (`recorded`, from the file
// at `recorded_path`; null when they recorded none): see config_for_checkpoint.
Config config_for_recorded(const std::string& path, const std::string* recorded,
                           const std::string& recorded_path, const std::string& source,
                           const std::vector<std::string>& overrides) {
  if (recorded == nullptr) {
    if (path.empty()) {
      throw ConfigError(source +
                        " does not hold the config it was trained with (an older hpm saved it, "
                        "or not hpm): give that config, with the run's --set overrides");
    }
    return load_config(path, overrides);
  }
  Config c;
  if (path.empty()) {
    c = load_config_text(*recorded, recorded_path, overrides);
    // Its starting weights were the training's business; the weights read are the trained ones.
    c.init_from.clear();
  } else {
    c = load_config(path, overrides);
  }
  check_against_checkpoint(c, *recorded, source);
  return c;
}

const std::string* find(const std::map<std::string, std::string>& m, const std::string& key) {
  const auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

}  // namespace

std::map<std::string, std::string> checkpoint_description(const Config& config) {
  toml::table root = toml::parse(config.resolved, config.path);
  if (toml::table* data = root["data"].as_table()) {
    for (const char* key : {"dir", "files", "test_files", "tokenizer"}) {
      toml::node* v = data->get(key);
      const std::optional<std::string> p =
          v != nullptr ? v->value_exact<std::string>() : std::nullopt;
      if (p && !p->empty() && std::filesystem::path(*p).is_relative())
        data->insert_or_assign(key, std::filesystem::absolute(*p).lexically_normal().string());
    }
  }
  std::ostringstream text;
  text << root;
  return {{"config", text.str()},
          {"config_path", std::filesystem::absolute(config.path).lexically_normal().string()}};
}

Config config_for_checkpoint(const std::string& path, const std::string& checkpoint,
                             const std::vector<std::string>& overrides) {
  std::map<std::string, std::string> metadata;
  try {
    // A parameter-server job's (its manifest), or a Trainer's.
    const std::string ps = distribute::ps::ps_checkpoint_dir(checkpoint);
    metadata = ps.empty() ? train::read_checkpoint_state(checkpoint).metadata
                          : distribute::ps::read_ps_checkpoint_metadata(ps);
  } catch (const std::exception& e) {
    if (path.empty()) throw ConfigError(e.what());
    return load_config(path, overrides);  // the checkpoint's own load reports it again
  }
  const std::string* where = find(metadata, "config_path");
  return config_for_recorded(path, find(metadata, "config"), where ? *where : checkpoint,
                             "the checkpoint " + checkpoint, overrides);
}

Config config_for_weights(const std::string& path, const std::string& weights,
                          const std::vector<std::string>& overrides) {
  std::map<std::string, std::string> metadata;
  try {
    metadata = io::read_safetensors_metadata(weights);  // the header: the tensors load later
  } catch (const std::exception& e) {
    if (path.empty()) throw ConfigError(e.what());
    return load_config(path, overrides);  // the weights' own load reports it again
  }
  const std::string* where = find(metadata, "hpm_config_path");
  return config_for_recorded(path, find(metadata, "hpm_config"), where ? *where : weights,
                             "the weights file " + weights, overrides);
}

Device& config_device(const Config& config) {
  const DeviceId id = parse_device_id(config.device);  // checked when the config was read
  if (id.type == DeviceType::kCpu) return Device::cpu();
  static std::mutex mu;
  static auto* devices = new std::map<std::string, std::unique_ptr<Device>>();  // for the process
  std::lock_guard lock(mu);
  auto& d = (*devices)[id.str()];
  if (!d) {
    try {
      d = std::make_unique<Device>(id, id.str());
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      refuse_setting(config, "train", "device",
                     "= \"" + config.device + "\" cannot be used: " +
                         (what.find("no backend") != std::string::npos
                              ? "this hpm was built without CUDA (HPM_CUDA=OFF, or no nvcc)"
                              : what));
    }
  }
  return *d;
}

void refuse_setting(const Config& config, const std::string& section, const std::string& key,
                    const std::string& why) {
  const auto it = config.given.find(key.empty() ? section : section + "." + key);
  const std::string at = it != config.given.end() ? it->second : config.path;
  throw ConfigError(at + ": [" + section + "]" + (key.empty() ? std::string() : " " + key) + " " +
                    why);
}

}  // namespace hpm::config
