// Command-line checks the subcommands share.
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hpm::cli {

// --seed: an integer in 0..2^63-1, the range of a TOML integer (CLI11's NonNegativeNumber would
// quote the largest double, 300 digits, as the bound).
inline CLI::Validator seed_range() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::size_t used = 0;
        long long v = -1;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (s.empty() || used != s.size() || v < 0)
          return "a seed is an integer in 0..2^63-1 (9223372036854775807), got " + s;
        return std::string();
      },
      "0..2^63-1");
}

// A finite number > 0 (or >= 0), for options of any numeric type: CLI11's PositiveNumber and
// NonNegativeNumber let NaN through and quote the largest double, 309 digits, as their bound.
inline CLI::Validator number_from_zero(bool zero_allowed) {
  return CLI::Validator(
      [zero_allowed](std::string& s) -> std::string {
        std::size_t used = 0;
        double v = std::nan("");
        try {
          v = std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool in_range = zero_allowed ? v >= 0 : v > 0;
        if (s.empty() || used != s.size() || !std::isfinite(v) || !in_range)
          return std::string(zero_allowed ? "expected a number >= 0" : "expected a number > 0") +
                 ", got " + s;
        return std::string();
      },
      zero_allowed ? "NONNEGATIVE" : "POSITIVE");
}
// `hpm sample CKPT`, `hpm evaluate CKPT|FILE.safetensors`: a first argument that names a
// directory is a checkpoint (a config is a file), one ending in .safetensors a weights file; it
// moves from `config` to whichever it names, unless that was given as a flag too.
inline void positional_checkpoint(std::string& config, std::string& checkpoint,
                                  std::string* weights = nullptr) {
  if (config.empty() || !checkpoint.empty() || (weights != nullptr && !weights->empty())) return;
  std::error_code ec;
  if (std::filesystem::is_directory(config, ec)) {
    checkpoint = std::exchange(config, std::string());
  } else if (weights != nullptr && config.size() > 12 &&
             config.compare(config.size() - 12, 12, ".safetensors") == 0) {
    *weights = std::exchange(config, std::string());
  }
}

// The flags of a command that reads a run configuration: CONFIG (positional, described by `what`;
// required unless `optional`), --set (repeatable) and, when `report` is given, --report.
inline CLI::Option* add_config_flags(CLI::App* cmd, std::string& config,
                                     std::vector<std::string>& overrides, const std::string& what,
                                     std::string* report = nullptr, bool optional = false) {
  CLI::Option* positional = cmd->add_option("config", config, what);
  if (!optional) positional->required();
  cmd->add_option("--set", overrides, "override a config value: section.key=value (repeatable)");
  if (report != nullptr) cmd->add_option("--report", *report, "write a JSON report to this file");
  return positional;
}

// "4K,64K,1M,2G": a --sizes list of byte counts (K, M, G: binary multiples; "KiB", "MiB", "GiB"
// and a bare "B" read alike). A malformed entry is a std::invalid_argument naming it.
inline std::vector<std::int64_t> parse_byte_sizes(const std::string& list) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    const std::string s = list.substr(start, comma - start);
    start = comma + 1;
    std::size_t used = 0;
    double v = -1;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    const std::string unit = s.substr(used);
    double mult = 0;
    if (unit.empty() || unit == "B") mult = 1;
    if (unit == "K" || unit == "k" || unit == "KiB") mult = 1024.0;
    if (unit == "M" || unit == "MiB") mult = 1048576.0;
    if (unit == "G" || unit == "GiB") mult = 1073741824.0;
    if (used == 0 || mult == 0 || !std::isfinite(v) || v <= 0) {
      throw std::invalid_argument("--sizes: \"" + s +
                                  "\" is not a size (a number > 0 with an optional K, M or G)");
    }
    out.push_back(static_cast<std::int64_t>(v * mult));
  }
  return out;
}

inline CLI::Validator positive_number() { return number_from_zero(false); }
inline CLI::Validator non_negative_number() { return number_from_zero(true); }

}  // namespace hpm::cli
