// This machine's name, for the files and messages that say which host wrote them.
#pragma once
#include <unistd.h>

#include <array>
#include <string>

namespace hpm::train {

// gethostname's answer, or `fallback` where it has none.
inline std::string host_name_or(const char* fallback) {
  std::array<char, 256> h{};
  if (::gethostname(h.data(), h.size() - 1) != 0) return fallback;
  return h.data();
}

}  // namespace hpm::train
