// Paths compared as the files they name, not as strings.
#pragma once
#include <string>

namespace hpm::io {

// `path` made absolute, its symbolic links (where they exist), ".", ".." and trailing slashes
// resolved: "ck", "./ck", "ck/" and "$PWD/ck" give the same result.
std::string resolved_path(const std::string& path);

// Whether `a` and `b` name the same directory or one lies inside the other. Two settings that
// overlap so would write (or prune) each other's files.
bool paths_overlap(const std::string& a, const std::string& b);

// Whether `inner` is `outer` or lies inside it.
bool path_within(const std::string& inner, const std::string& outer);

}  // namespace hpm::io
