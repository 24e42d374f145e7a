#include "config/reader.h"

#include <map>

namespace hpm::config::detail {

namespace {

constexpr const char* kOverride = "--set ";

// The values --set put in the table being read, and the override of each: a node copied into
// the table keeps no source, so where() looks it up here (one configuration at a time per
// thread, from clear_overrides() on).
thread_local std::map<const toml::node*, std::string> overridden;

}  // namespace

void clear_overrides() { overridden.clear(); }

std::string where(const std::string& path, const toml::source_region& src) {
  std::ostringstream os;
  os << path;
  if (src.begin.line > 0) os << ':' << src.begin.line << ':' << src.begin.column;
  return os.str();
}

std::string where(const std::string& path, const toml::node& node) {
  if (const auto it = overridden.find(&node); it != overridden.end()) return it->second;
  return where(path, node.source());
}

std::string value_text(const toml::node& node) {
  if (node.is_array()) return "an array";
  if (node.is_table()) return "a table";
  if (const auto str = node.value_exact<std::string>()) return '"' + *str + '"';
  std::ostringstream os;
  node.visit([&](const auto& v) { os << v; });
  return os.str();
}

const toml::table* section(const std::string& path, const toml::table& root, const char* name) {
  const toml::node* n = root.get(name);
  if (!n) return nullptr;
  if (!n->is_table()) throw ConfigError(where(path, *n) + ": [" + name + "] must be a table");
  return n->as_table();
}

void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    throw ConfigError(kOverride + assignment + ": expected section.key=value");
  }
  const std::string sec = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string value = assignment.substr(eq + 1);
  const std::string origin = kOverride + assignment;
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value, origin);
  } catch (const toml::parse_error&) {
    // Digits TOML cannot hold are a number out of range, not a bare word.
    const std::size_t sign = !value.empty() && (value[0] == '-' || value[0] == '+') ? 1 : 0;
    if (value.size() > sign && value.find_first_not_of("0123456789_", sign) == std::string::npos) {
      throw ConfigError(origin + ": " + value +
                        " is out of range for a 64-bit integer (-2^63..2^63-1)");
    }
    // A bare word: take it as a string (parsed, so that it too remembers the override).
    std::string quoted;
    for (char ch : value) {
      if (ch == '\\' || ch == '"') quoted += '\\';
      quoted += ch;
    }
    parsed = toml::parse("v = \"" + quoted + "\"", origin);
  }
  toml::node* target = root.get(sec);
  if (!target) {
    root.insert(sec, toml::table{});
    target = root.get(sec);
  }
  if (!target->is_table()) throw ConfigError(origin + ": [" + sec + "] is not a table");
  toml::table& table = *target->as_table();
  table.insert_or_assign(key, *parsed.get("v"));
  overridden[table.get(key)] = origin;
  // How long to train is said once: an override of one measure replaces the file's other one
  // (--set train.max_steps=500 on a config of epochs trains 500 steps). Erased here rather than
  // ignored when [train] is read, so that the resolved configuration a checkpoint records holds
  // the one measure and reads back without the --set.
  if (sec == "train" && (key == "max_steps" || key == "epochs")) {
    const char* other = key == "max_steps" ? "epochs" : "max_steps";
    if (const toml::node* o = table.get(other); o != nullptr && !overridden.count(o)) {
      table.erase(other);
    }
  }
}

void TableReader::get_integers(const std::string& key, std::vector<std::int64_t>& out) {
  used_.insert(key);
  const toml::node* node = find(key);
  if (!node) return;
  const toml::array* a = node->as_array();
  std::vector<std::int64_t> values;
  for (std::size_t i = 0; a && i < a->size(); ++i) {
    const auto v = (*a)[i].value_exact<std::int64_t>();
    if (!v) fail(*node, key, "an array of integers");
    values.push_back(*v);
  }
  if (!a) fail(*node, key, "an array of integers");
  out = std::move(values);
}

std::string TableReader::at(const std::string& key) const {
  const toml::node* n = find(key);
  return n ? where(path_, *n) : path_;
}

void TableReader::finish() const {
  if (!table_) return;
  for (const auto& [k, v] : *table_) {
    const std::string key(k.str());
    if (!used_.count(key)) {
      std::ostringstream known;
      for (const auto& u : used_) known << (known.tellp() > 0 ? ", " : "") << u;
      // A key --set added has no place in the file: its value remembers the override.
      const std::string at = k.source().begin.line > 0 ? where(path_, k.source()) : where(path_, v);
      throw ConfigError(at + ": unknown key '" + key + "' in " + section_ +
                        " (known keys: " + known.str() + ")");
    }
  }
}

void TableReader::invalid(const std::string& key, const std::string& what) const {
  throw ConfigError(at(key) + ": " + section_ + " " + key + " " + what);
}

void TableReader::out_of_range(const toml::node& node, const std::string& key,
                               const std::string& expected) const {
  throw ConfigError(where(path_, node) + ": " + section_ + " " + key + " must be " + expected +
                    ", got " + value_text(node));
}

void TableReader::fail(const toml::node& node, const std::string& key,
                       const std::string& expected) const {
  std::ostringstream os;
  os << where(path_, node) << ": " << section_ << " " << key << " must be " << expected << ", got ";
  if (node.is_array() || node.is_table()) {
    os << node.type();
  } else {
    os << node.type() << ' ' << value_text(node);
  }
  throw ConfigError(os.str());
}

}  // namespace hpm::config::detail
