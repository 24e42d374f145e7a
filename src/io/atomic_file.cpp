#include "hpm/io/atomic_file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hpm::io {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string parent_directory(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Closes the fd and removes the temporary file unless released: every early exit (throw) of
// write_file_atomic leaves no temporary behind.
class TempFile {
 public:
  TempFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!released_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  int fd() const { return fd_; }
  // close(2) can report deferred write errors (NFS, quotas), so its result matters.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }
  void release() { released_ = true; }

 private:
  std::string path_;
  int fd_;
  bool released_ = false;
};

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string output_file_target(const std::string& path) {
  if (path.empty()) throw IoError("cannot write a file of an empty path");
  std::string target = path;
  struct stat st {};
  for (int hops = 0;; ++hops) {
    if (::lstat(target.c_str(), &st) != 0) {
      if (errno != ENOENT) {
        const int err = errno;
        throw IoError("cannot write " + path + ": " + target + ": " + errno_text(err));
      }
      break;  // a new file
    }
    if (!S_ISLNK(st.st_mode)) {
      if (!S_ISREG(st.st_mode)) {
        throw IoError("cannot write " + path + ": " +
                      (target == path ? std::string() : "its target " + target + " ") + "is " +
                      file_kind(st.st_mode) + ", not a regular file: refusing to replace it");
      }
      break;
    }
    if (hops >= 40) throw IoError("cannot write " + path + ": too many levels of symbolic links");
    // Write through the link: the file it names is replaced, the link stays.
    std::string link(4096, '\0');
    const ssize_t n = ::readlink(target.c_str(), link.data(), link.size());
    if (n < 0) {
      const int err = errno;
      throw IoError("cannot write " + path + ": readlink " + target + ": " + errno_text(err));
    }
    link.resize(static_cast<std::size_t>(n));
    target = !link.empty() && link[0] == '/' ? link : parent_directory(target) + "/" + link;
  }
  const std::string dir = parent_directory(target);
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0) {
    const int err = errno;
    throw IoError("cannot write " + path + ": its directory " + dir +
                  (err == ENOENT ? " does not exist: " : ": ") + errno_text(err));
  }
  if (!S_ISDIR(dst.st_mode))
    throw IoError("cannot write " + path + ": " + dir + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0) {
    const int err = errno;
    throw IoError("cannot write " + path + ": its directory " + dir +
                  " is not writable: " + errno_text(err));
  }
  return target;
}

void write_file_atomic(const std::string& requested, std::string_view data) {
  if (requested.empty()) throw IoError("write_file_atomic: empty path");
  // A symbolic link is written through; anything but a regular file is refused.
  const std::string path = output_file_target(requested);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const auto fail = [&](const std::string& what, int err) {
    throw IoError("cannot write " + path + ": " + what + " " + tmp + ": " + errno_text(err));
  };

  // A write past RLIMIT_FSIZE raises SIGXFSZ, whose default action kills the process; check the
  // limit first so the caller gets an error instead (the file is written from offset 0).
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      static_cast<std::uint64_t>(data.size()) > static_cast<std::uint64_t>(lim.rlim_cur)) {
    throw IoError("cannot write " + path + ": " + std::to_string(data.size()) +
                  " bytes exceed the file size limit RLIMIT_FSIZE of " +
                  std::to_string(lim.rlim_cur) + " bytes: " + errno_text(EFBIG));
  }

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) fail("cannot create temporary file", errno);
  TempFile file(tmp, fd);

  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw IoError("cannot write " + path + ": write to " + tmp + " failed at byte offset " +
                    std::to_string(done) + " of " + std::to_string(data.size()) + ": " +
                    errno_text(err));
    }
    if (n == 0) {
      throw IoError("cannot write " + path + ": write to " + tmp + " made no progress at byte " +
                    "offset " + std::to_string(done) + " of " + std::to_string(data.size()));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync of", errno);
  if (file.close() != 0) fail("close of", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    throw IoError("cannot write " + path + ": rename of " + tmp +
                  " over it failed: " + errno_text(err));
  }
  file.release();

  // Make the rename itself durable. Some filesystems cannot fsync a directory (EINVAL); the new
  // contents are in place either way, so only real I/O errors are reported.
  const std::string dir = parent_directory(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    const int err = errno;
    throw IoError("wrote " + path + " but cannot open its directory " + dir +
                  " to fsync it: " + errno_text(err));
  }
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL && err != EROFS) {
    throw IoError("wrote " + path + " but fsync of its directory " + dir +
                  " failed: " + errno_text(err));
  }
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw IoError("cannot open " + path + ": " + errno_text(err));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};

  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    out.reserve(static_cast<std::size_t>(st.st_size));
  }
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw IoError("cannot read " + path + " at byte offset " + std::to_string(out.size()) + ": " +
                    errno_text(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

void ensure_directory(const std::string& path) {
  if (path.empty()) throw IoError("ensure_directory: empty path");
  // Create each prefix ending before a '/', then the full path.
  std::size_t pos = 0;
  for (;;) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0777) != 0) {
      const int err = errno;
      struct stat st {};
      if (err != EEXIST) {
        // EACCES or EROFS on an existing component is fine; stat tells whether it exists.
        if (::stat(prefix.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
          throw IoError("cannot create directory " + path + ": mkdir " + prefix + ": " +
                        errno_text(err));
        }
      } else if (::stat(prefix.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        throw IoError("cannot create directory " + path + ": " + prefix +
                      " exists and is not a directory");
      }
    }
    if (pos == std::string::npos) break;
  }
  if (::access(path.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    throw IoError("directory " + path + " is not writable: " + errno_text(err));
  }
}

}  // namespace hpm::io
