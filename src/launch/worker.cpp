#include "hpm/launch/worker.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "hpm/launch/supervisor.h"

namespace hpm::launch {

namespace {

std::atomic<bool> preempted{false};

// SA_RESETHAND: a second one ends the process at once.
void on_preemption(int) { preempted.store(true); }

// The handler's own stack. oneDNN's JIT GEMM kernels (libdnnl 2.x; fixed upstream in
// uxlfoundation/oneDNN#4855) point the stack pointer into a heap workspace while they run: a
// signal handled on the interrupted stack has the kernel write its frame (registers and several
// KiB of vector state) into the heap below that workspace, and a later free() aborts ("corrupted
// size vs. prev_size while consolidating"). On one device the main thread runs the matrix products,
// and a signal sent to the process is delivered to the main thread.
alignas(64) char signal_stack[1 << 18];

}  // namespace

const std::atomic<bool>* install_preemption_handlers() {
  stack_t stack{};
  stack.ss_sp = signal_stack;
  stack.ss_size = sizeof signal_stack;
  if (::sigaltstack(&stack, nullptr) != 0) {
    throw std::runtime_error(std::string("sigaltstack failed: ") + std::strerror(errno));
  }
  struct sigaction sa {};
  sa.sa_handler = on_preemption;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_ONSTACK | SA_RESTART | SA_RESETHAND;
  for (int sig : {SIGTERM, SIGINT}) {
    if (::sigaction(sig, &sa, nullptr) != 0) {
      throw std::runtime_error(std::string("sigaction failed: ") + std::strerror(errno));
    }
  }
  return &preempted;
}

void watch_launcher_from_env() {
  const char* spec = std::getenv(kLauncherFdVariable);
  if (spec == nullptr || *spec == '\0') return;
  char* end = nullptr;
  const long fd = std::strtol(spec, &end, 10);
  struct stat st {};
  if (*end != '\0' || fd < 0 || fd > 1 << 20 || ::fstat(static_cast<int>(fd), &st) != 0 ||
      !S_ISFIFO(st.st_mode)) {
    return;  // not (or no longer) the launcher's pipe
  }
  // Not passed on: the process this one starts has its own launcher, or none.
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  ::unsetenv(kLauncherFdVariable);
  // To the main thread, whose handler runs on its own stack (see signal_stack), not to whichever
  // thread the kernel picks.
  std::thread([fd = static_cast<int>(fd), main_thread = ::pthread_self()] {
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    // Nobody writes to the lifeline: it wakes only when the launcher's end closes, which is
    // when the launcher is gone. Stop as a preempted run does (SIGTERM: a backup when there is
    // somewhere to write one), rather than train on under PID 1 with nobody to report to.
    static const char msg[] = "hpm: the launcher is gone; stopping\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::pthread_kill(main_thread, SIGTERM);
  }).detach();
}

}  // namespace hpm::launch
