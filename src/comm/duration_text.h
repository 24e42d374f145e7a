// "3 s", "250 ms", "1.5 s": a timeout as error messages print it.
#pragma once
#include <cstdio>
#include <string>

#include "hpm/comm/communicator.h"

namespace hpm::comm {

inline std::string seconds_text(Milliseconds t) {
  if (t.count() % 1000 == 0) return std::to_string(t.count() / 1000) + " s";
  if (t.count() < 1000) return std::to_string(t.count()) + " ms";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

}  // namespace hpm::comm
