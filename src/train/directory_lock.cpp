#include "hpm/train/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "hpm/io/atomic_file.h"
#include "hpm/io/error.h"
#include "train/host_name.h"

namespace hpm::train {

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what)
    : dir_(dir), path_(dir + "/" + kFileName) {
  std::error_code ec;
  created_ = !std::filesystem::exists(dir, ec);
  io::ensure_directory(dir);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    throw io::IoError("cannot open the lock file " + path_ + ": " + std::strerror(errno));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t got = ::pread(fd_, holder.data(), holder.size(), 0);
    holder.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    created_ = false;
    if (err != EWOULDBLOCK) {
      throw io::IoError("cannot lock " + path_ + ": " + std::strerror(err));
    }
    throw DirectoryBusy(what + " " + dir + " is in use by another run (" +
                        (holder.empty() ? std::string("holder unknown") : holder) + ", lock " +
                        path_ + "): wait for it to finish, or choose another directory");
  }
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host_name_or("?") + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    // The lock holds without its note; a refused run then says "holder unknown".
  }
}

DirectoryLock::~DirectoryLock() { release(); }

DirectoryLock::DirectoryLock(DirectoryLock&& other) noexcept
    : dir_(std::move(other.dir_)),
      path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      created_(std::exchange(other.created_, false)) {}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    release();
    dir_ = std::move(other.dir_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    created_ = std::exchange(other.created_, false);
  }
  return *this;
}

void DirectoryLock::release() {
  if (fd_ < 0) return;
  // Unlinked while still held: a run that opened the file before the unlink and locks it after
  // the close holds a lock on a removed file, which only matters if two more runs race for it.
  ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
  // A run that made the directory and wrote nothing into it (it failed early) leaves none.
  if (created_) ::rmdir(dir_.c_str());
}

}  // namespace hpm::train
