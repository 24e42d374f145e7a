// Reading TOML for the run configuration: where a value came from (FILE:LINE:COL, or the --set
// override that put it there), a reader for one table that checks each key's type and range and
// reports leftovers, and --set itself. Every section of the config (sections.h) reads through it,
// so every error has one form: "WHERE: [section] key must be ..., got VALUE".
#pragma once
#include <toml++/toml.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>

#include "hpm/config/config.h"
#include "hpm/data/input_pipeline.h"

namespace hpm::config::detail {

// Forgets the overrides of the previous configuration read on this thread.
void clear_overrides();

// FILE:LINE:COL of a node, or "--set section.key=value" for a value an override put there.
std::string where(const std::string& path, const toml::source_region& src);
std::string where(const std::string& path, const toml::node& node);

// A value as written: 3, -1.5, "adam", true; arrays and tables by their type.
std::string value_text(const toml::node& node);

// The table `name` of the root, or null; anything else under that name is an error.
const toml::table* section(const std::string& path, const toml::table& root, const char* name);

// Applies "section.key=value" (value in TOML syntax, or a bare word taken as a string); the values
// it puts in remember the override, so errors about them name it.
void apply_override(toml::table& root, const std::string& assignment);

// Reads the keys of one table, remembering which were used so leftovers can be reported.
class TableReader {
 public:
  TableReader(const std::string& path, std::string section, const toml::table* table)
      : path_(path), section_(std::move(section)), table_(table) {}

  template <typename T>
  void get(const std::string& key, T& out) {
    used_.insert(key);
    const toml::node* node = find(key);
    if (!node) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (auto v = node->value_exact<bool>()) {
        out = *v;
        return;
      }
      fail(*node, key, "a boolean (true or false)");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (auto v = node->value_exact<std::string>()) {
        out = *v;
        return;
      }
      fail(*node, key, "a string");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (auto v = node->value<double>(); v && node->is_number()) {
        // A value beyond the type's range (1e39 in a float) would become inf; nan stays for the
        // range checks that follow to refuse.
        if (std::isinf(static_cast<T>(*v)) || std::abs(*v) > std::numeric_limits<T>::max())
          out_of_range(*node, key, "a finite number");
        out = static_cast<T>(*v);
        return;
      }
      fail(*node, key, "a number");
    } else {
      if (auto v = node->value_exact<std::int64_t>()) {
        // Kept whole or refused: a narrower setting would keep only the low bits (4294967297
        // threads ran as 1).
        bool fits = true;
        if constexpr (std::is_signed_v<T>) {
          fits = *v >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
                 *v <= static_cast<std::int64_t>(std::numeric_limits<T>::max());
        } else {
          fits = *v >= 0 && static_cast<std::uint64_t>(*v) <=
                                static_cast<std::uint64_t>(std::numeric_limits<T>::max());
        }
        if (!fits) {
          out_of_range(*node, key,
                       "between " + std::to_string(std::numeric_limits<T>::min()) + " and " +
                           std::to_string(std::numeric_limits<T>::max()));
        }
        out = static_cast<T>(*v);
        return;
      }
      fail(*node, key, "an integer");
    }
  }

  // A list of integers: [16, 32, 64].
  void get_integers(const std::string& key, std::vector<std::int64_t>& out);

  template <typename T>
  void get_positive(const std::string& key, T& out) {
    get(key, out);
    if (const toml::node* n = find(key); n && !(out > 0)) out_of_range(*n, key, "positive");
  }

  template <typename T>
  void get_non_negative(const std::string& key, T& out) {
    get(key, out);
    // Written !(out >= 0), so that NaN (TOML's nan) is refused too.
    if (const toml::node* n = find(key); n && !(out >= 0)) out_of_range(*n, key, ">= 0");
  }

  // A non-negative integer, or the string "autotune" (stored as data::kAutotune).
  template <typename T>
  void get_count_or_autotune(const std::string& key, T& out) {
    used_.insert(key);
    const toml::node* node = find(key);
    if (!node) return;
    if (auto s = node->value_exact<std::string>(); s && *s == "autotune") {
      out = static_cast<T>(data::kAutotune);
      return;
    }
    if (auto v = node->value_exact<std::int64_t>(); v && *v >= 0) {
      out = static_cast<T>(*v);
      return;
    }
    fail(*node, key, "a non-negative integer or \"autotune\"");
  }

  void allow(const std::string& key) { used_.insert(key); }
  bool has(const std::string& key) const { return find(key) != nullptr; }
  const toml::node* find(const std::string& key) const {
    return table_ ? table_->get(key) : nullptr;
  }
  // WHERE of a key (its value), or of the file when it is absent.
  std::string at(const std::string& key) const;

  // Every key of the table was read (or allowed); else "unknown key", naming the known ones.
  void finish() const;

  // A value of the right type that the section cannot take: "WHERE: [section] key what"
  // (`what` quotes the value: "must be >= 0, got -3").
  [[noreturn]] void invalid(const std::string& key, const std::string& what) const;
  // "must be <expected>, got VALUE" for a value of the right type out of its range.
  [[noreturn]] void out_of_range(const toml::node& node, const std::string& key,
                                 const std::string& expected) const;
  // "must be <expected>, got VALUE (a TYPE)" for a value of the wrong type.
  [[noreturn]] void fail(const toml::node& node, const std::string& key,
                         const std::string& expected) const;

  const std::string& path() const { return path_; }
  const std::string& name() const { return section_; }

 private:
  const std::string& path_;
  std::string section_;
  const toml::table* table_;
  std::set<std::string> used_;
};

}  // namespace hpm::config::detail
