#include "hpm/io/paths.h"

#include <filesystem>

namespace hpm::io {

namespace fs = std::filesystem;

namespace {
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path).lexically_normal();
  p = p.lexically_normal();
  if (p.has_relative_path() && p.filename().empty()) p = p.parent_path();  // "ck/" is "ck"
  return p;
}
}  // namespace

std::string resolved_path(const std::string& path) { return resolved(path).string(); }

bool path_within(const std::string& inner, const std::string& outer) {
  const fs::path in = resolved(inner), out = resolved(outer);
  auto i = in.begin();
  for (auto o = out.begin(); o != out.end(); ++o, ++i) {
    if (i == in.end() || *i != *o) return false;
  }
  return true;
}

bool paths_overlap(const std::string& a, const std::string& b) {
  return path_within(a, b) || path_within(b, a);
}

}  // namespace hpm::io
