// `hpm launch`: one process per rank, their output relayed line by line, signals forwarded, the
// group stopped when a rank fails.
//
// Each rank runs in its own process group, so a terminal's Ctrl-C reaches the launcher alone (and
// is forwarded once), and stopping a rank also stops whatever it started. Its stdin is /dev/null;
// PR_SET_PDEATHSIG sends it SIGTERM should the launcher die. The launcher is one thread: a poll()
// loop over the ranks' stdout/stderr pipes and a self-pipe written by the signal handlers.
#include "hpm/launch/supervisor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>
#include <random>
#include <thread>

#include "hpm/comm/store.h"

namespace hpm::launch {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxLine = 1 << 20;  // longer lines are relayed in pieces of this size
constexpr auto kDrainAfterExit = std::chrono::milliseconds(1000);

}  // namespace

const char* const kHelpFooter =
    "Each rank gets HPM_RANK, HPM_LOCAL_RANK, HPM_WORLD_SIZE and HPM_RENDEZVOUS: --rendezvous, or\n"
    "a fresh directory (removed at the end) in --rendezvous-dir or the temporary directory; and\n"
    "HPM_TIMEOUT with --timeout. Its stdout and stderr lines are relayed whole, prefixed with\n"
    "\"[RANK] \"; its stdin is /dev/null. SIGINT and SIGTERM are forwarded to every rank. When\n"
    "a rank exits non-zero or is killed, the others get SIGTERM, then SIGKILL after --grace s.\n"
    "\n"
    "With --max-restarts K, a failure stops every rank and starts the group again (a fresh\n"
    "rendezvous; HPM_RESTART counts the attempts), at most K times, after --restart-delay s,\n"
    "doubled each time (at most 60 s). Failures that would recur are not restarted: exit\n"
    "status 1 (bad input), 2 (usage), 3 (a non-finite loss), 6 (out of memory), 126 and 127\n"
    "(the program cannot be run or found). A lost peer (5: a timeout, a dead rank) is restarted.\n"
    "\n"
    "Exit status: 0 when every rank exits 0; else that of the first rank to fail (its exit\n"
    "status, or 128+N when killed by signal N); 128+N when the launcher itself got signal N;\n"
    "1 when the ranks cannot be started; 2 for a usage error.";

namespace {

int ms_until(Clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// ---- signals ---------------------------------------------------------------------------------

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// Installs the handlers for the launcher's lifetime and restores the previous ones after.
class SignalRelay {
 public:
  SignalRelay() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw std::runtime_error("pipe2 failed");
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &old_pipe_);  // a closed stdout must not kill the launcher
  }
  ~SignalRelay() {
    for (std::size_t i = 0; i < std::size(kSignals); ++i)
      ::sigaction(kSignals[i], &old_[i], nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
  }
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  int fd() const { return g_signal_pipe[0]; }

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGCHLD};
  struct sigaction old_[std::size(kSignals)]{};
  struct sigaction old_pipe_ {};
};

// ---- output ----------------------------------------------------------------------------------

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;  // our own output is gone; keep running the ranks
    }
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "hpm launch: " + message + "\n"); }

// One rank's stdout or stderr: bytes in, whole prefixed lines out, each in a single write.
struct Stream {
  int fd = -1;
  int out_fd = STDOUT_FILENO;
  std::string prefix;
  std::string pending;

  void emit_lines(bool at_eof) {
    std::size_t start = 0;
    for (;;) {
      const std::size_t nl = pending.find('\n', start);
      if (nl == std::string::npos) break;
      write_all(out_fd, prefix + pending.substr(start, nl + 1 - start));
      start = nl + 1;
    }
    pending.erase(0, start);
    if (pending.size() >= kMaxLine || (at_eof && !pending.empty())) {
      write_all(out_fd, prefix + pending + "\n");
      pending.clear();
    }
  }
  // Reads what is available (at most 4 MiB, so that one chatty rank cannot starve the others);
  // false at end of file.
  bool pump() {
    char buf[64 * 1024];
    for (int reads = 0; reads < 64; ++reads) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        pending.append(buf, static_cast<std::size_t>(n));
        emit_lines(false);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      close();
      return false;
    }
    return true;
  }
  void close() {
    if (fd < 0) return;
    emit_lines(true);
    ::close(fd);
    fd = -1;
  }
};

// ---- ranks -----------------------------------------------------------------------------------

struct Rank {
  int index = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
};

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + signal_name(WTERMSIG(status));
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// The read end of the launcher's lifeline (fault_tolerance.h), made once; the write end is
// close-on-exec and never written, so it closes exactly when the launcher process ends.
int lifeline_read_end() {
  static const int fd = [] {
    int life[2];
    if (::pipe2(life, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    }
    return life[0];
  }();
  return fd;
}

// Forks rank `index` with its pipes and environment and execs the command.
void start_rank(Rank& r, const LaunchOptions& o, const std::string& rendezvous, int attempt) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  const pid_t launcher = ::getpid();
  const int lifeline = lifeline_read_end();
  // Until the child has restored the default dispositions, a signal would run the launcher's
  // handler in it and write to the launcher's self-pipe: hold signals across the fork.
  sigset_t all, before;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &before);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(128 + SIGTERM);
    for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::setenv("HPM_RANK", std::to_string(r.index).c_str(), 1);
    ::setenv("HPM_LOCAL_RANK", std::to_string(r.index).c_str(), 1);
    ::setenv("HPM_WORLD_SIZE", std::to_string(o.processes).c_str(), 1);
    ::setenv("HPM_RENDEZVOUS", rendezvous.c_str(), 1);
    ::setenv("HPM_RESTART", std::to_string(attempt).c_str(), 1);
    const int inherited = ::dup(lifeline);  // without close-on-exec
    if (inherited >= 0) ::setenv(kLauncherFdVariable, std::to_string(inherited).c_str(), 1);
    if (o.ps_workers > 0) {
      const bool ps = r.index >= 1 && r.index <= o.ps_tasks;
      ::setenv("HPM_PS_ROLE", r.index == 0 ? "coordinator" : ps ? "ps" : "worker", 1);
      ::setenv("HPM_PS_INDEX",
               std::to_string(r.index == 0 ? 0
                              : ps         ? r.index - 1
                                           : r.index - 1 - o.ps_tasks)
                   .c_str(),
               1);
      ::setenv("HPM_PS_CLUSTER", o.ps_cluster.c_str(), 1);
    }
    if (o.timeout_s > 0) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", o.timeout_s);
      ::setenv("HPM_TIMEOUT", seconds, 1);
    }
    std::vector<char*> argv;
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    const std::string msg =
        "hpm launch: cannot run " + o.command[0] + ": " + std::strerror(errno) + "\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg.data(), msg.size());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also here: whichever of parent and child runs first
  ::close(out[1]);
  ::close(err[1]);
  r.pid = pid;
  r.running = true;
  // Appended rather than concatenated: GCC 12 reports a false -Wrestrict for "[" + to_string().
  std::string prefix = "[";
  prefix += std::to_string(r.index);
  prefix += "] ";
  r.out = Stream{out[0], STDOUT_FILENO, prefix, {}};
  r.err = Stream{err[0], STDERR_FILENO, prefix, {}};
  for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// HOST:PORT as given, with port 0 replaced by a port free on HOST right now.
std::string resolve_rendezvous(const std::string& text) {
  comm::HostPort hp = comm::parse_host_port(text);
  if (hp.port == 0) {
    comm::TcpStoreServer probe(hp.host, 0);
    hp.port = probe.port();
  }
  return hp.str();
}

class Launcher {
 public:
  Launcher(const LaunchOptions& o, int attempt)
      : o_(o), attempt_(attempt), ranks_(static_cast<std::size_t>(o.processes)) {}

  bool interrupted() const { return interrupted_ != 0; }

  int run(const std::string& rendezvous) {
    SignalRelay relay;
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      ranks_[i].index = static_cast<int>(i);
      try {
        start_rank(ranks_[i], o_, rendezvous, attempt_);
      } catch (const std::exception& e) {
        say(std::string("cannot start rank ") + std::to_string(i) + ": " + e.what());
        stop_all(SIGKILL);
        reap_all_blocking();
        return 1;
      }
    }
    loop(relay.fd());
    if (interrupted_) return 128 + interrupted_;
    if (first_failure_) return exit_code_of(ranks_[*first_failure_].status);
    return 0;
  }

 private:
  void loop(int signal_fd) {
    std::optional<Clock::time_point> kill_at, drain_until;
    for (;;) {
      std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
      std::vector<Stream*> streams;
      for (auto& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
      // Wake at least every 200 ms: a SIGCHLD may go astray.
      Clock::time_point wake = Clock::now() + std::chrono::milliseconds(200);
      for (const auto& at : {kill_at, drain_until})
        if (at) wake = std::min(wake, *at);
      ::poll(fds.data(), fds.size(), ms_until(wake));
      if (fds[0].revents & POLLIN) handle_signals(signal_fd, kill_at);
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) streams[i - 1]->pump();
      }
      reap(kill_at);
      if (kill_at && Clock::now() >= *kill_at) {
        for (auto& r : ranks_) {
          if (!r.running) continue;
          say("rank " + std::to_string(r.index) + " still running " + format_seconds(o_.grace_s) +
              " after " + stopped_with_ + ": sending SIGKILL");
          ::kill(-r.pid, SIGKILL);
        }
        kill_at.reset();
      }
      const bool any_running =
          std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
      if (any_running) continue;
      if (streams.empty()) return;
      // Every rank has exited; something they started may still hold a pipe open.
      if (!drain_until) drain_until = Clock::now() + kDrainAfterExit;
      if (Clock::now() >= *drain_until) {
        for (Stream* s : streams) s->close();
        return;
      }
    }
  }

  static std::string format_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g s", s);
    return buf;
  }

  void handle_signals(int signal_fd, std::optional<Clock::time_point>& kill_at) {
    unsigned char sigs[64];
    const ssize_t n = ::read(signal_fd, sigs, sizeof sigs);
    for (ssize_t i = 0; i < n; ++i) {
      const int sig = sigs[i];
      if (sig == SIGCHLD) continue;  // reaped below
      if (!interrupted_) interrupted_ = sig;
      say("got " + signal_name(sig) + ": forwarding it to the ranks");
      stop_all(sig);
      stopped_with_ = signal_name(sig);
      if (!kill_at) kill_at = Clock::now() + grace();
    }
  }

  void reap(std::optional<Clock::time_point>& kill_at) {
    for (auto& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.status = status;
      // Its last words first: what is still in its pipes.
      r.out.pump();
      r.err.pump();
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (!failed || first_failure_ || interrupted_) continue;
      first_failure_ = static_cast<std::size_t>(r.index);
      const bool others =
          std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& x) { return x.running; });
      say("rank " + std::to_string(r.index) + " " + describe_exit(status) +
          (others ? "; stopping the other ranks" : ""));
      if (others) {
        stop_all(SIGTERM);
        kill_at = Clock::now() + grace();
      }
    }
  }

  void stop_all(int sig) {
    for (auto& r : ranks_)
      if (r.running) ::kill(-r.pid, sig);
  }

  void reap_all_blocking() {
    for (auto& r : ranks_) {
      if (!r.running) continue;
      ::waitpid(r.pid, &r.status, 0);
      r.running = false;
      r.out.close();
      r.err.close();
    }
  }

  Clock::duration grace() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_s));
  }

  const LaunchOptions& o_;
  int attempt_;
  std::vector<Rank> ranks_;
  std::optional<std::size_t> first_failure_;
  int interrupted_ = 0;
  std::string stopped_with_ = "SIGTERM";  // what the ranks were last asked to stop with
};

}  // namespace

namespace {

// One attempt: its own rendezvous (a fresh FileStore directory, or the TCP store's address with
// port 0 resolved anew), removed afterwards. Returns the attempt's exit status.
int run_attempt(const LaunchOptions& o, int attempt, bool* interrupted) {
  std::string rendezvous = o.rendezvous_dir;
  std::string temporary;
  if (!o.rendezvous.empty()) {
    try {
      rendezvous = resolve_rendezvous(o.rendezvous);
    } catch (const std::exception& e) {
      say(e.what());
      return 2;
    }
  } else {
    // A fresh directory per run (inside --rendezvous-dir if given): keys a previous run left
    // behind would send the ranks to dead addresses.
    std::error_code ec;
    const std::filesystem::path parent = rendezvous.empty() ? std::filesystem::temp_directory_path()
                                                            : std::filesystem::absolute(rendezvous);
    std::filesystem::create_directories(parent, ec);
    std::string tmpl = (parent / "hpm-launch-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      say("cannot create a rendezvous directory in " + parent.string() + ": " +
          std::strerror(errno));
      return 1;
    }
    rendezvous = temporary = tmpl;
  }
  Launcher launcher(o, attempt);
  const int code = launcher.run(rendezvous);
  *interrupted = launcher.interrupted();
  if (!temporary.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temporary, ec);
  }
  return code;
}

}  // namespace

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

// Why a restart would fail the same way, for the exit statuses that say so; else empty.
std::string recurring_failure(int code) {
  switch (code) {
    case 1:
      return "bad input (a config, data file or checkpoint)";
    case 2:
      return "a usage error";
    case 3:
      return "a non-finite loss, which the same seed meets again";
    case kExitOutOfMemory:
      return "the training step does not fit the memory budget";
    case 126:
      return "the program cannot be run";
    case 127:
      return "the program was not found";
    default:
      return "";
  }
}

int run_launch(const LaunchOptions& options) {
  LaunchOptions o = options;
  if (o.ps_workers > 0) {
    o.processes = 1 + o.ps_tasks + o.ps_workers;
    std::string ps;
    for (int t = 0; t < o.ps_tasks; ++t)
      ps += (t ? ", " : "") + std::string("\"127.0.0.1:") + std::to_string(free_port()) + "\"";
    o.ps_cluster = "{\"coordinator\": \"127.0.0.1:" + std::to_string(free_port()) +
                   "\", \"ps\": [" + ps + "], \"workers\": " + std::to_string(o.ps_workers) + "}";
    if (std::getenv("HPM_PS_TOKEN") == nullptr) {
      std::random_device rd;
      char token[33];
      for (int i = 0; i < 32; ++i) token[i] = "0123456789abcdef"[rd() % 16];
      token[32] = '\0';
      ::setenv("HPM_PS_TOKEN", token, 1);
    }
  } else if (o.processes < 1) {
    say("give -n N, or --ps P --workers W");
    return 2;
  }
  for (int attempt = 0;; ++attempt) {
    bool interrupted = false;
    const auto started = Clock::now();
    const int code = run_attempt(o, attempt, &interrupted);
    if (code == 0) {
      if (attempt > 0) say("all ranks finished after " + std::to_string(attempt) + " restart(s)");
      return 0;
    }
    // A launcher told to stop, no restarts left, or a failure that would recur: this is the
    // answer.
    const std::string recurs = recurring_failure(code);
    if (interrupted || attempt >= o.max_restarts || !recurs.empty()) {
      if (o.max_restarts > 0 && !interrupted && code != 2) {
        say((recurs.empty() ? std::string()
                            : "exit status " + std::to_string(code) + " means " + recurs +
                                  ": a restart would fail the same way; ") +
            "giving up after " + std::to_string(attempt) + " restart(s)");
      }
      return code;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    const double delay = std::min(60.0, o.restart_delay_s * std::pow(2.0, attempt));
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "restarting all %d ranks (restart %d of %d) in %.1f s; the attempt failed after "
                  "%.1f s",
                  o.processes, attempt + 1, o.max_restarts, delay, seconds);
    say(buf);
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  }
}

}  // namespace hpm::launch
