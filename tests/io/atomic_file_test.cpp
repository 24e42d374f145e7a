#include "hpm/io/atomic_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "io_test_util.h"

namespace hpm::io {
namespace {

using testing::io_error_of;

class AtomicFile : public testing::TempDirTest {
 protected:
  // Runs write_file_atomic(p, data) in a forked child with RLIMIT_FSIZE = `limit` bytes and
  // SIGXFSZ ignored or left at its default (which would kill the child if a write hit the limit).
  // Returns the child's IoError message, or a description of how it ended otherwise.
  std::string write_in_limited_child(const std::string& p, const std::string& data, rlim_t limit,
                                     bool ignore_sigxfsz) {
    int fds[2];
    if (::pipe(fds) != 0) return "pipe failed";
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      if (ignore_sigxfsz) ::signal(SIGXFSZ, SIG_IGN);
      struct rlimit lim {
        limit, limit
      };
      ::setrlimit(RLIMIT_FSIZE, &lim);
      std::string msg;
      try {
        write_file_atomic(p, data);
        msg = "no error";
      } catch (const IoError& e) {
        msg = e.what();
      }
      const ssize_t n = ::write(fds[1], msg.data(), msg.size());
      ::_exit(n == static_cast<ssize_t>(msg.size()) ? 0 : 1);
    }
    ::close(fds[1]);
    std::string msg;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<std::size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) return "child killed by signal " + std::to_string(WTERMSIG(status));
    return msg;
  }
};

TEST_F(AtomicFile, WritesReplacesAndReads) {
  const std::string p = path("f.bin");
  const std::string data("a\0b\xff", 4);
  write_file_atomic(p, data);
  EXPECT_EQ(read_file(p), data);
  write_file_atomic(p, "second");
  EXPECT_EQ(read_file(p), "second");
  write_file_atomic(p, "");
  EXPECT_EQ(read_file(p), "");
  EXPECT_EQ(listing(), std::vector<std::string>({"f.bin"}));  // no temporary left behind
}

TEST_F(AtomicFile, LargeData) {
  std::string data(3 << 20, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131);
  write_file_atomic(path("big"), data);
  EXPECT_EQ(read_file(path("big")), data);
}

TEST_F(AtomicFile, RelativePathInCurrentDirectory) {
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(::chdir(dir_.c_str()), 0);
  write_file_atomic("rel.txt", "x");
  EXPECT_EQ(read_file("rel.txt"), "x");
  ASSERT_EQ(::chdir(cwd), 0);
}

// A write past RLIMIT_FSIZE with SIGXFSZ ignored must be an IoError (EFBIG), and the old file must
// survive untouched with no temporary left behind.
TEST_F(AtomicFile, FileSizeLimitKeepsOldFile) {
  const std::string p = path("ckpt");
  write_file_atomic(p, "old contents");
  const std::string msg = write_in_limited_child(p, std::string(4096, 'n'), 1000, true);
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, std::strerror(EFBIG));
  EXPECT_EQ(read_file(p), "old contents");
  EXPECT_EQ(listing(), std::vector<std::string>({"ckpt"}));
}

// With SIGXFSZ at its default action the limit must still give an error, not kill the process.
TEST_F(AtomicFile, FileSizeLimitWithDefaultSigxfszDoesNotKill) {
  const std::string p = path("ckpt");
  write_file_atomic(p, "old contents");
  const std::string msg = write_in_limited_child(p, std::string(4096, 'n'), 1000, false);
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "RLIMIT_FSIZE");
  EXPECT_EQ(read_file(p), "old contents");
  EXPECT_EQ(listing(), std::vector<std::string>({"ckpt"}));
}

TEST_F(AtomicFile, FileSizeLimitAllowsSmallWrites) {
  const std::string p = path("small");
  EXPECT_EQ(write_in_limited_child(p, std::string(1000, 's'), 1000, true), "no error");
  EXPECT_EQ(read_file(p), std::string(1000, 's'));
}

TEST_F(AtomicFile, MissingDirectoryIsAnError) {
  const std::string p = path("no/such/dir/f");
  const std::string msg = io_error_of([&] { write_file_atomic(p, "x"); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, std::strerror(ENOENT));
}

// Only a regular file is replaced: a directory (or a FIFO, a device) is refused before anything
// is written, and left as it is.
TEST_F(AtomicFile, ADirectoryOrAFifoIsRefusedAndKept) {
  const std::string p = path("target");
  ensure_directory(p + "/child");
  std::string msg = io_error_of([&] { write_file_atomic(p, "x"); });
  EXPECT_CONTAINS(msg, "cannot write " + p +
                           ": is a directory, not a regular file: refusing to "
                           "replace it");
  EXPECT_EQ(listing(), std::vector<std::string>({"target"}));
  EXPECT_EQ(std::filesystem::is_directory(p + "/child"), true);
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  msg = io_error_of([&] { write_file_atomic(fifo, "x"); });
  EXPECT_CONTAINS(msg, "cannot write " + fifo + ": is a FIFO, not a regular file");
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
}

// A symbolic link is written through: the file it names gets the new contents, the link stays.
TEST_F(AtomicFile, ASymlinkIsWrittenThrough) {
  ensure_directory(path("sub"));
  write_file_atomic(path("sub/real"), "old");
  std::filesystem::create_symlink("sub/real", path("link"));
  write_file_atomic(path("link"), "new");
  EXPECT_TRUE(std::filesystem::is_symlink(path("link")));
  EXPECT_EQ(read_file(path("sub/real")), "new");
  EXPECT_EQ(output_file_target(path("link")), path("sub/real"));
}

TEST_F(AtomicFile, UnwritableDirectoryKeepsOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const std::string p = path("f");
  write_file_atomic(p, "old");
  ASSERT_EQ(::chmod(dir_.c_str(), 0500), 0);
  const std::string msg = io_error_of([&] { write_file_atomic(p, "new"); });
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, std::strerror(EACCES));
  EXPECT_EQ(read_file(p), "old");
}

TEST_F(AtomicFile, ReadMissingFile) {
  const std::string p = path("absent");
  EXPECT_CONTAINS(io_error_of([&] { read_file(p); }),
                  "cannot open " + p + ": " + std::strerror(ENOENT));
}

TEST_F(AtomicFile, ReadDirectory) {
  EXPECT_CONTAINS(io_error_of([&] { read_file(dir_); }), "cannot read " + dir_);
}

TEST_F(AtomicFile, EnsureDirectoryCreatesParentsAndIsIdempotent) {
  const std::string p = path("a/b//c/");
  ensure_directory(p);
  ensure_directory(p);
  EXPECT_TRUE(std::filesystem::is_directory(path("a/b/c")));
  ensure_directory(dir_);
}

TEST_F(AtomicFile, EnsureDirectoryOverAFile) {
  write_file_atomic(path("file"), "x");
  const std::string p = path("file/sub");
  const std::string msg = io_error_of([&] { ensure_directory(p); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, path("file") + " exists and is not a directory");
}

TEST_F(AtomicFile, EnsureDirectoryNotWritable) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const std::string p = path("ro");
  ensure_directory(p);
  ASSERT_EQ(::chmod(p.c_str(), 0500), 0);
  const std::string msg = io_error_of([&] { ensure_directory(p); });
  EXPECT_CONTAINS(msg, "directory " + p + " is not writable");
}

}  // namespace
}  // namespace hpm::io
