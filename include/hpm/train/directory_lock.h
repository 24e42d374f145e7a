// One run per output directory: a second process (or a second Trainer) that writes checkpoints or
// backups into a directory another run is writing would interleave their files, prune each
// other's checkpoints and move `latest` under the other's feet.
#pragma once
#include <stdexcept>
#include <string>

namespace hpm::train {

// Holds an exclusive lock (flock(2) on `<dir>/.hpm-lock`) for its lifetime; the kernel releases it
// when the process dies, however it dies, so a crashed run never leaves a stale lock. The lock
// file holds the holder's pid and host for the message of the run that is refused, and is
// removed when the lock is released, and with it the directory if the lock made it and it is
// left empty.
class DirectoryLock {
 public:
  DirectoryLock() = default;
  // Creates `dir` when missing. Throws DirectoryBusy (naming `what`, the directory and the
  // holder) without waiting when another run holds it.
  DirectoryLock(const std::string& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(DirectoryLock&& other) noexcept;
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  static constexpr const char* kFileName = ".hpm-lock";

 private:
  void release();
  std::string dir_, path_;
  int fd_ = -1;
  bool created_ = false;
};

class DirectoryBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace hpm::train
