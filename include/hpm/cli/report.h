// The machine-readable report of a command (--report FILE): one JSON document, written atomically
// (a reader never sees half of it, and an earlier report stays until the new one is complete).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "hpm/io/atomic_file.h"

namespace hpm::cli {

// Writes `report` to `path`, indented; nothing when `path` is empty (no --report given). A string
// that is not UTF-8 (text drawn from a byte-level model, a file name) is written with U+FFFD for
// its invalid bytes rather than fail the command after its work is done.
inline void write_report(const std::string& path, const nlohmann::json& report) {
  if (path.empty()) return;
  io::write_file_atomic(
      path, report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace hpm::cli
