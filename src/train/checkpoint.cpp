#include "hpm/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>

#include "hpm/io/atomic_file.h"
#include "hpm/io/crc32c.h"
#include "hpm/io/safetensors.h"

namespace hpm::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr const char* kFormat = "hpm-checkpoint-1";

std::string checksum_hex(std::string_view bytes) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", io::crc32c(bytes.data(), bytes.size()));
  return buf;
}

// The files save_checkpoint writes into a ckpt-* directory (and write_file_atomic's temporaries
// of them, "<name>.tmp.<pid>", which a crash mid-write can leave).
constexpr const char* kCheckpointFiles[] = {"model.safetensors", "optimizer.safetensors",
                                            "callbacks.safetensors", "iterator.bin",
                                            "trainer_state.json"};

// Whether `name` is `file` or one of its write_file_atomic temporaries.
bool names_file(const std::string& name, const std::string& file) {
  const std::string tmp = file + ".tmp.";
  return name == file || (name.rfind(tmp, 0) == 0 &&
                          name.find_first_not_of("0123456789", tmp.size()) == std::string::npos);
}

bool is_checkpoint_file(const std::string& name) {
  return std::any_of(std::begin(kCheckpointFiles), std::end(kCheckpointFiles),
                     [&](const char* f) { return names_file(name, f); });
}

// hpm deletes only what it wrote: a checkpoint's own files, by name, then its directory if that
// leaves it empty (a file someone else put there keeps it, and itself).
void remove_checkpoint_files(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> ours;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_checkpoint_file(e.path().filename().string())) ours.push_back(e.path());
  for (const auto& f : ours) fs::remove(f, ec);
  if (fs::is_empty(dir, ec) && !ec) fs::remove(dir, ec);
}

// The ckpt-<N> directories under `root` by step, ascending (none when root does not exist). Not a
// symbolic link (its target lies outside root), not "ckpt-900.bak" (a copy), not an N past 64
// bits: none of those is one save_checkpoint made.
std::vector<std::pair<std::int64_t, fs::path>> checkpoint_dirs(const std::string& root) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory(ec) || e.is_symlink(ec) || !is_checkpoint_name(n)) continue;
    try {
      found.emplace_back(std::stoll(n.substr(5)), e.path());
    } catch (const std::exception&) {
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Whether `name` is a directory save_checkpoint writes beside ckpt-<N> while it replaces it,
// "ckpt-<N>.tmp.<pid>" (the new one, staged) or "ckpt-<N>.old.<pid>" (the old one, moved aside
// where the filesystem cannot exchange two directories): a crash can leave one.
bool is_staging_name(const std::string& name) {
  for (const char* mark : {".tmp.", ".old."}) {
    const std::size_t at = name.find(mark);
    if (at == std::string::npos || at + 5 >= name.size()) continue;
    if (is_checkpoint_name(name.substr(0, at)) &&
        name.find_first_not_of("0123456789", at + 5) == std::string::npos)
      return true;
  }
  return false;
}

// Puts the complete checkpoint staged in `staged` where `dir`, an older one of the same step, is,
// in one step where the filesystem can (renameat2's RENAME_EXCHANGE: `dir` is at every moment one
// whole checkpoint or the other), otherwise in two renames. Files someone else put in `dir` move
// into the new one; the old checkpoint's own files are deleted.
void replace_checkpoint_dir(const std::string& staged, const std::string& dir) {
  std::string old = staged;
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    if (err != EINVAL && err != ENOSYS && err != ENOTSUP) {
      throw CheckpointError("cannot replace " + dir + " by " + staged + ": " + std::strerror(err) +
                            " (" + dir + " is unchanged)");
    }
    old = dir + ".old." + std::to_string(::getpid());
    if (::rename(dir.c_str(), old.c_str()) != 0) {
      const int e = errno;
      throw CheckpointError("cannot move " + dir + " aside to replace it: " + std::strerror(e) +
                            " (" + dir + " is unchanged)");
    }
    if (::rename(staged.c_str(), dir.c_str()) != 0) {
      const int e = errno;
      ::rename(old.c_str(), dir.c_str());
      throw CheckpointError("cannot move " + staged + " to " + dir + ": " + std::strerror(e));
    }
  }
  std::error_code ec;
  std::vector<fs::path> theirs;
  for (const auto& e : fs::directory_iterator(old, ec))
    if (!is_checkpoint_file(e.path().filename().string())) theirs.push_back(e.path());
  for (const auto& f : theirs) fs::rename(f, fs::path(dir) / f.filename(), ec);
  remove_checkpoint_files(old);
}

std::string resolve(const std::string& path) {
  if (fs::exists(path + "/trainer_state.json")) return path;
  const std::string latest = path + "/latest";
  if (!fs::exists(latest)) {
    throw CheckpointError("no checkpoint at " + path + ": neither trainer_state.json nor latest");
  }
  std::string name = io::read_file(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return path + "/" + name;
}
}  // namespace

std::string save_checkpoint(const std::string& root, const nn::Module& model,
                            const optim::Optimizer& optimizer, const TrainerState& state,
                            int keep) {
  io::ensure_directory(root);
  const std::string name = "ckpt-" + std::to_string(state.global_step);
  const std::string final_dir = root + "/" + name;
  // A checkpoint of this step already there (a run repeated from it, a caller's second save) is
  // replaced whole or not at all: the new one is written beside it and swapped in, so a crash or
  // a full disk midway leaves the old one readable. It was rewritten file by file in place, and a
  // failure between two files left neither checkpoint (the last of its step, with keep = 1).
  std::error_code ec;
  const fs::file_status existing = fs::symlink_status(final_dir, ec);
  const bool replacing = fs::exists(existing);
  if (replacing && existing.type() != fs::file_type::directory) {
    throw CheckpointError("cannot save checkpoint " + final_dir +
                          ": it exists and is not a directory save_checkpoint made (a file or a "
                          "symbolic link); it was left as it is");
  }
  const std::string dir = replacing ? final_dir + ".tmp." + std::to_string(::getpid()) : final_dir;
  if (replacing) remove_checkpoint_files(dir);  // a crashed save's, of this process id
  io::ensure_directory(dir);
  struct StagedFiles {  // a failed replacement deletes what it staged
    const std::string* dir;
    ~StagedFiles() {
      if (dir != nullptr) remove_checkpoint_files(*dir);
    }
  } staged{replacing ? &dir : nullptr};
  json files = json::object();
  auto write = [&](const std::string& file, const io::NamedTensors& tensors) {
    const std::string bytes = io::encode_safetensors(tensors, {{"format", "pt"}});
    io::write_file_atomic(dir + "/" + file, bytes);
    files[file] = {{"crc32c", checksum_hex(bytes)}, {"bytes", bytes.size()}};
  };
  write("model.safetensors", model.state_dict());
  write("optimizer.safetensors", optimizer.state());
  if (!state.callback_tensors.empty()) write("callbacks.safetensors", state.callback_tensors);
  if (!state.iterator_state.empty()) {
    io::write_file_atomic(dir + "/iterator.bin", state.iterator_state);
    files["iterator.bin"] = {{"crc32c", checksum_hex(state.iterator_state)},
                             {"bytes", state.iterator_state.size()}};
  } else {
    std::error_code ec;
    fs::remove(dir + "/iterator.bin", ec);
  }
  json rng = json::array();
  for (auto w : state.rng.s) rng.push_back(std::to_string(w));
  json j = {{"format", kFormat},
            {"epoch", state.epoch},
            {"step_in_epoch", state.step_in_epoch},
            {"global_step", state.global_step},
            {"seed", std::to_string(state.seed)},
            {"rng", rng},
            {"rng_has_spare", state.rng.has_spare},
            {"rng_spare", state.rng.spare},
            {"optimizer", optimizer.name()},
            {"files", files}};
  if (state.batch_size > 0) j["input_batch_size"] = state.batch_size;
  if (!state.replica_rngs.empty()) {
    json replicas = json::array();
    for (const Generator::State& g : state.replica_rngs) {
      json words = json::array();
      for (auto w : g.s) words.push_back(std::to_string(w));
      replicas.push_back({{"rng", words}, {"has_spare", g.has_spare}, {"spare", g.spare}});
    }
    j["replica_rngs"] = replicas;
  }
  if (!state.metadata.empty()) j["metadata"] = state.metadata;
  io::write_file_atomic(dir + "/trainer_state.json", j.dump(2) + "\n");
  if (replacing) {
    replace_checkpoint_dir(dir, final_dir);
    staged.dir = nullptr;
  }
  io::write_file_atomic(root + "/latest", name + "\n");

  // Prune the checkpoints older than this one, keeping the newest keep - 1 of them. Those of later
  // steps (a run continued from an earlier checkpoint of this root, which the Trainer refuses; a
  // library caller's) are another history's: never deleted here, nor this one just written.
  std::vector<std::pair<std::int64_t, fs::path>> older = checkpoint_dirs(root);
  std::erase_if(older, [&](const auto& f) { return f.first >= state.global_step; });
  const auto keep_older = static_cast<std::size_t>(std::max(keep, 1)) - 1;
  for (std::size_t i = 0; i + keep_older < older.size(); ++i)
    remove_checkpoint_files(older[i].second);
  return final_dir;
}

bool holds_checkpoints(const std::string& root) {
  std::error_code ec;
  return fs::exists(fs::path(root) / "latest", ec) || !checkpoint_dirs(root).empty();
}

std::vector<std::string> checkpoints_not_of_kind(const std::string& root, const std::string& kind) {
  std::vector<std::string> out;
  for (const auto& [step, dir] : checkpoint_dirs(root)) {
    TrainerState s;
    try {
      s = read_checkpoint_state(dir.string());
    } catch (const std::exception&) {
      continue;
    }
    const auto it = s.metadata.find(kCheckpointKind);
    if (it == s.metadata.end() || it->second != kind) out.push_back(dir.string());
  }
  return out;
}

std::vector<std::int64_t> checkpoint_steps_after(const std::string& root, std::int64_t step) {
  std::vector<std::int64_t> out;
  for (const auto& [s, dir] : checkpoint_dirs(root))
    if (s > step) out.push_back(s);
  return out;
}

void remove_checkpoints(const std::string& root) {
  std::error_code ec;
  for (const auto& [step, dir] : checkpoint_dirs(root)) remove_checkpoint_files(dir);
  std::vector<fs::path> staging;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec) && !e.is_symlink(ec) && is_staging_name(e.path().filename().string()))
      staging.push_back(e.path());
  for (const auto& d : staging) remove_checkpoint_files(d);
  std::vector<fs::path> latest;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (names_file(e.path().filename().string(), "latest")) latest.push_back(e.path());
  for (const auto& f : latest) fs::remove(f, ec);
}

// The fields of trainer_state.json (json::exception names only the key; the caller adds the file).
static void read_state_fields(const nlohmann::json& j, TrainerState& s);

namespace {

// A checkpoint directory's trainer_state.json, parsed, and its files read with their checksums
// verified before anyone uses them.
struct OpenedCheckpoint {
  std::string dir, state_path;
  json j;

  explicit OpenedCheckpoint(const std::string& path)
      : dir(resolve(path)), state_path(dir + "/trainer_state.json") {
    try {
      j = json::parse(io::read_file(state_path));
    } catch (const json::exception& e) {
      throw CheckpointError(state_path + ": not valid JSON: " + e.what());
    }
    if (j.value("format", "") != kFormat) {
      throw CheckpointError(state_path + ": unknown format (expected " + kFormat + ")");
    }
  }

  std::string verified(const std::string& file) const {
    const std::string p = dir + "/" + file;
    const std::string bytes = io::read_file(p);
    std::string expected;
    try {
      expected = j.at("files").at(file).at("crc32c").get<std::string>();
    } catch (const json::exception& e) {
      throw CheckpointError(state_path + ": " + e.what());
    }
    if (checksum_hex(bytes) != expected) {
      throw CheckpointError(p + ": checksum mismatch (CRC32C " + checksum_hex(bytes) +
                            ", trainer_state.json records " + expected +
                            "): the file is corrupt or was modified");
    }
    return bytes;
  }
};

}  // namespace

std::string resolve_checkpoint_dir(const std::string& path) { return resolve(path); }

bool is_checkpoint_name(const std::string& name) {
  return name.size() > 5 && name.rfind("ckpt-", 0) == 0 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

io::NamedTensors load_checkpoint_weights(const std::string& path) {
  const OpenedCheckpoint c(path);
  return io::decode_safetensors(c.verified("model.safetensors"), c.dir + "/model.safetensors")
      .tensors;
}

TrainerState read_checkpoint_state(const std::string& path) {
  const OpenedCheckpoint c(path);
  TrainerState s;
  try {
    read_state_fields(c.j, s);
  } catch (const json::exception& e) {
    throw CheckpointError(c.state_path + ": " + e.what());
  }
  return s;
}

TrainerState load_checkpoint(const std::string& path, nn::Module& model,
                             optim::Optimizer* optimizer) {
  const OpenedCheckpoint c(path);
  const std::string& dir = c.dir;
  const std::string& state_path = c.state_path;
  const json& j = c.j;
  // Every file is read and checked before anything is modified; without an optimizer to restore,
  // its file is neither needed nor read.
  auto verified = [&](const std::string& file) { return c.verified(file); };
  std::map<std::string, io::SafetensorsFile> loaded;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    if (optimizer == nullptr && std::string(file) == "optimizer.safetensors") continue;
    loaded.emplace(file, io::decode_safetensors(verified(file), dir + "/" + file));
  }
  std::string iterator_state;
  if (j.contains("files") && j["files"].contains("iterator.bin"))
    iterator_state = verified("iterator.bin");
  nn::NamedTensors callback_tensors;
  if (j.contains("files") && j["files"].contains("callbacks.safetensors")) {
    callback_tensors =
        io::decode_safetensors(verified("callbacks.safetensors"), dir + "/callbacks.safetensors")
            .tensors;
  }
  try {
    model.load_weights(loaded.at("model.safetensors").tensors);
    if (optimizer) optimizer->load_state(loaded.at("optimizer.safetensors").tensors);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(dir + ": checkpoint does not match the model: " + e.what());
  }
  TrainerState s;
  try {
    read_state_fields(j, s);
  } catch (const json::exception& e) {
    throw CheckpointError(state_path + ": " + e.what());
  }
  s.iterator_state = std::move(iterator_state);
  s.callback_tensors = std::move(callback_tensors);
  return s;
}

static void read_state_fields(const nlohmann::json& j, TrainerState& s) {
  s.epoch = j.at("epoch").get<std::int64_t>();
  s.step_in_epoch = j.at("step_in_epoch").get<std::int64_t>();
  s.global_step = j.at("global_step").get<std::int64_t>();
  s.batch_size = j.value("input_batch_size", std::int64_t{0});  // absent before it was recorded
  s.seed = std::stoull(j.at("seed").get<std::string>());
  for (std::size_t i = 0; i < 4; ++i)
    s.rng.s[i] = std::stoull(j.at("rng").at(i).get<std::string>());
  s.rng.has_spare = j.at("rng_has_spare").get<bool>();
  s.rng.spare = j.at("rng_spare").get<float>();
  if (j.contains("metadata"))  // absent before it was recorded
    s.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
  if (j.contains("replica_rngs")) {  // absent without a strategy, and before it was recorded
    for (const auto& r : j.at("replica_rngs")) {
      Generator::State g;
      for (std::size_t i = 0; i < 4; ++i)
        g.s[i] = std::stoull(r.at("rng").at(i).get<std::string>());
      g.has_spare = r.at("has_spare").get<bool>();
      g.spare = r.at("spare").get<float>();
      s.replica_rngs.push_back(g);
    }
  }
}

std::optional<RestoredCheckpoint> restore_newest_usable(const std::string& root, nn::Module& model,
                                                        optim::Optimizer* optimizer) {
  const std::vector<std::pair<std::int64_t, fs::path>> found = checkpoint_dirs(root);
  if (found.empty()) return std::nullopt;
  RestoredCheckpoint r;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {  // newest first
    const std::string dir = it->second.string();
    try {
      r.state = load_checkpoint(dir, model, optimizer);
      r.dir = dir;
      return r;
    } catch (const std::exception& e) {  // corrupt JSON, checksum, truncated file, missing file
      r.skipped.push_back(dir + ": " + e.what());
    }
  }
  std::string why;
  for (const auto& s : r.skipped) why += "\n  " + s;
  throw CheckpointError("no usable checkpoint in " + root + " (nothing was changed):" + why);
}

}  // namespace hpm::train
