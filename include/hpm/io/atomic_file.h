// Whole-file reads and crash-safe whole-file writes.
//
// Checkpoints must never be left half-written: write_file_atomic writes a temporary file next to
// the target, fsyncs it, renames it over the target and fsyncs the directory, so after a crash (or
// a full disk, a quota, a file-size limit) the path holds either the old or the new contents.
#pragma once
#include <string>
#include <string_view>

#include "hpm/io/error.h"

namespace hpm::io {

// Writes `data` to `path` atomically via "<path>.tmp.<pid>" in the same directory. Every write is
// checked; on any failure the temporary file is removed, `path` is left untouched and an IoError
// names the path and the system error (ENOSPC, EDQUOT, EFBIG, EACCES, ...).
//
// RLIMIT_FSIZE: a write past the soft limit raises SIGXFSZ, which by default kills the process.
// The limit is checked before writing, so a too-large file is reported as an EFBIG IoError without
// the signal; if the signal is ignored (signal(SIGXFSZ, SIG_IGN)) a failing write is reported the
// same way. Two threads of one process must not write the same path concurrently.
//
// A symbolic link at `path` is followed and the file it names replaced (the link stays); a path
// that is (or links to) anything but a regular file (a directory, a FIFO, a device) is refused.
void write_file_atomic(const std::string& path, std::string_view data);

// Where write_file_atomic(path) would write: `path`, or the file its symbolic links lead to. An
// IoError naming `path` when that is not a regular file or its directory is missing or not
// writable, so outputs can be checked before the work that produces them.
std::string output_file_target(const std::string& path);

// The whole contents of a file. IoError "cannot open <path>: <strerror>" (or "cannot read ...").
std::string read_file(const std::string& path);

// mkdir -p: creates `path` and its missing parents. IoError if a component exists and is not a
// directory, if creation fails, or if the final directory is not writable (access(W_OK)).
void ensure_directory(const std::string& path);

}  // namespace hpm::io
