// Command-line checks the subcommands share.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

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

}  // namespace hpm::cli
