// Rendezvous stores: the TCP key-value server and its client, and the FileStore wrapper.
//
// Wire protocol (TcpStore <-> TcpStoreServer), every message a frame: u32 body length (little
// endian, at most kStoreMaxMessageBytes) then the body. Strings are u32 length + bytes.
//
//   request  u8 op, then        reply  u8 status (0 ok, 1 timeout, 2 error + string), then
//   SET  key, value                     -
//   GET  u64 timeout_ms, key            value (ok)
//   WAIT u64 timeout_ms, u32 n, keys    u32 m, the m keys still missing (timeout)
//   ADD  key, i64 delta                 i64 sum (ok)
//
// GET and WAIT are parked at the server until their keys are set or their timeout passes, so a
// waiting client costs nothing and learns of a key as soon as it is set.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gloo/rendezvous/file_store.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "comm/duration_text.h"
#include "hpm/comm/store.h"

namespace hpm::comm {

namespace {

using Clock = std::chrono::steady_clock;

enum Op : std::uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4 };
// The longest a request may wait at the server (longer timeouts are cut to it).
constexpr Milliseconds kMaxWait = std::chrono::hours(24);
enum Status : std::uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "'" : ", '") + k + "'";
  return s;
}

// ---- message encoding ----------------------------------------------------------------------

class Writer {
 public:
  Writer& u8(std::uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(std::uint32_t v) { return raw(&v, sizeof v); }
  Writer& u64(std::uint64_t v) { return raw(&v, sizeof v); }
  Writer& bytes(const char* p, std::size_t n) {
    u32(static_cast<std::uint32_t>(n));
    return raw(p, n);
  }
  Writer& str(const std::string& s) { return bytes(s.data(), s.size()); }
  // The frame: length prefix, then the body.
  std::vector<char> frame() const {
    std::vector<char> f(4 + buf_.size());
    const auto n = static_cast<std::uint32_t>(buf_.size());
    std::memcpy(f.data(), &n, 4);
    std::copy(buf_.begin(), buf_.end(), f.begin() + 4);
    return f;
  }
  std::size_t size() const { return buf_.size(); }

 private:
  Writer& raw(const void* p, std::size_t n) {
    buf_.insert(buf_.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
    return *this;
  }
  std::vector<char> buf_;
};

class Reader {
 public:
  Reader(const char* p, std::size_t n) : p_(p), n_(n) {}
  std::uint8_t u8() {
    std::uint8_t v;
    raw(&v, 1);
    return v;
  }
  std::uint32_t u32() {
    std::uint32_t v;
    raw(&v, sizeof v);
    return v;
  }
  std::uint64_t u64() {
    std::uint64_t v;
    raw(&v, sizeof v);
    return v;
  }
  std::vector<char> bytes() {
    const std::uint32_t n = u32();
    need(n);
    std::vector<char> v(p_, p_ + n);
    p_ += n;
    n_ -= n;
    return v;
  }
  std::string str() {
    const std::vector<char> b = bytes();
    return std::string(b.begin(), b.end());
  }

 private:
  void need(std::size_t n) const {
    if (n > n_) throw std::runtime_error("truncated store message");
  }
  void raw(void* out, std::size_t n) {
    need(n);
    std::memcpy(out, p_, n);
    p_ += n;
    n_ -= n;
  }
  const char* p_;
  std::size_t n_;
};

// ---- sockets -------------------------------------------------------------------------------

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Waits until fd is ready for `events`; false when the deadline passes first.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rv = ::poll(&p, 1, remaining_ms(deadline));
    if (rv > 0) return true;
    if (rv == 0) return false;
    if (errno != EINTR) return false;
  }
}

addrinfo* resolve(const HostPort& hp, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(hp.port);
  const int rv =
      ::getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &res);
  if (rv != 0) {
    *error = ::gai_strerror(rv);
    return nullptr;
  }
  return res;
}

// One connection attempt to any address of hp, bounded by the deadline; -1 and *error on failure.
int try_connect(const HostPort& hp, Clock::time_point deadline, std::string* error) {
  addrinfo* res = resolve(hp, false, error);
  if (res == nullptr) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      *error = std::strerror(errno);
      continue;
    }
    int rv = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rv != 0 && errno == EINPROGRESS) {
      if (wait_fd(fd, POLLOUT, deadline)) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rv = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rv != 0) {
      *error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

// Writes all of [p, p+n); false on error or when the deadline passes.
bool write_all(int fd, const char* p, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t rv = ::send(fd, p, n, MSG_NOSIGNAL);
    if (rv > 0) {
      p += rv;
      n -= static_cast<std::size_t>(rv);
    } else if (rv < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline)) return false;
    } else if (rv < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

enum class ReadResult { kOk, kClosed, kTimeout };

ReadResult read_exact(int fd, char* p, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t rv = ::recv(fd, p, n, 0);
    if (rv > 0) {
      p += rv;
      n -= static_cast<std::size_t>(rv);
    } else if (rv == 0) {
      return ReadResult::kClosed;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline)) return ReadResult::kTimeout;
    } else if (errno != EINTR) {
      return ReadResult::kClosed;
    }
  }
  return ReadResult::kOk;
}

}  // namespace

// ---- addresses -----------------------------------------------------------------------------

std::string HostPort::str() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

HostPort parse_host_port(const std::string& text) {
  const auto bad = [&](const char* why) {
    return std::invalid_argument("rendezvous address '" + text + "': " + why +
                                 " (expected HOST:PORT, e.g. 10.0.0.1:29500)");
  };
  HostPort hp;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw bad("unterminated [IPv6] address");
    }
    hp.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) throw bad("no port");
    hp.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (hp.host.empty()) throw bad("no host");
  int value = -1;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value < 0 || value > 65535) {
    throw bad("port must be a number in 0..65535");
  }
  hp.port = value;
  return hp;
}

// ---- server --------------------------------------------------------------------------------

struct TcpStoreServer::Impl {
  struct Parked {
    bool get = false;  // GET (reply with the value) or WAIT
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };
  struct Client {
    std::vector<char> in, out;
    std::size_t out_sent = 0;
    bool parked = false;
    Parked wait;
    bool closing = false;  // drop once `out` is flushed
    bool hung_up = false;  // the peer sent all it will (EOF): serve what it sent, then drop it
  };

  int listen_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::thread thread;
  std::unordered_map<std::string, std::vector<char>> data;
  std::size_t total_bytes = 0;
  std::map<int, Client> clients;

  ~Impl() {
    for (auto& [fd, c] : clients) ::close(fd);
    if (listen_fd >= 0) ::close(listen_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  bool has(const std::string& key) const { return data.count(key) != 0; }

  static void reply(Client& c, const Writer& w) {
    const std::vector<char> f = w.frame();
    c.out.insert(c.out.end(), f.begin(), f.end());
  }
  static void reply_error(Client& c, const std::string& message) {
    Writer w;
    reply(c, w.u8(kError).str(message));
  }

  void reply_parked(Client& c, bool timed_out) {
    Writer w;
    if (!timed_out) {
      w.u8(kOk);
      if (c.wait.get) {
        const auto& v = data.at(c.wait.keys[0]);
        w.bytes(v.data(), v.size());
      }
    } else {
      w.u8(kTimeout);
      std::vector<std::string> missing;
      for (const auto& k : c.wait.keys)
        if (!has(k)) missing.push_back(k);
      w.u32(static_cast<std::uint32_t>(missing.size()));
      for (const auto& k : missing) w.str(k);
    }
    reply(c, w);
    c.parked = false;
    c.wait = Parked{};
  }

  void wake_parked() {
    for (auto& [fd, c] : clients) {
      if (c.parked && std::all_of(c.wait.keys.begin(), c.wait.keys.end(),
                                  [&](const std::string& k) { return has(k); })) {
        reply_parked(c, false);
      }
    }
  }

  void put(Client& c, const std::string& key, std::vector<char> value) {
    auto it = data.find(key);
    const std::size_t old = it == data.end() ? 0 : it->second.size() + key.size();
    if (total_bytes - old + key.size() + value.size() > kStoreMaxTotalBytes) {
      reply_error(c, "the store is full (" + std::to_string(kStoreMaxTotalBytes >> 20) + " MiB)");
      return;
    }
    total_bytes = total_bytes - old + key.size() + value.size();
    data[key] = std::move(value);
  }

  // Handles one request; throws on a malformed one (the connection is then dropped).
  void handle(Client& c, const char* body, std::size_t n) {
    Reader r(body, n);
    const std::uint8_t op = r.u8();
    switch (op) {
      case kSet: {
        const std::string key = r.str();
        std::vector<char> value = r.bytes();
        const std::size_t before = c.out.size();
        put(c, key, std::move(value));
        if (c.out.size() == before) reply(c, Writer().u8(kOk));
        wake_parked();
        return;
      }
      case kGet:
      case kWait: {
        const auto timeout = Milliseconds(static_cast<std::int64_t>(
            std::min<std::uint64_t>(r.u64(), static_cast<std::uint64_t>(kMaxWait.count()))));
        Parked p;
        p.get = op == kGet;
        const std::uint32_t count = p.get ? 1 : r.u32();
        for (std::uint32_t i = 0; i < count; ++i) p.keys.push_back(r.str());
        p.deadline = Clock::now() + timeout;
        c.parked = true;
        c.wait = std::move(p);
        const bool ready = std::all_of(c.wait.keys.begin(), c.wait.keys.end(),
                                       [&](const std::string& k) { return has(k); });
        if (ready || timeout.count() <= 0) reply_parked(c, !ready);
        return;
      }
      case kAdd: {
        const std::string key = r.str();
        const auto delta = static_cast<std::int64_t>(r.u64());
        std::int64_t value = 0;
        if (auto it = data.find(key); it != data.end()) {
          const auto& v = it->second;
          const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
          if (ec != std::errc() || end != v.data() + v.size()) {
            reply_error(c, "add: key '" + key + "' does not hold an integer");
            return;
          }
        }
        const std::int64_t held = value;
        if (__builtin_add_overflow(held, delta, &value)) {
          reply_error(c, "add: key '" + key + "' would overflow a 64-bit integer (" +
                             std::to_string(held) + " + " + std::to_string(delta) + ")");
          return;
        }
        const std::string text = std::to_string(value);
        const std::size_t before = c.out.size();
        put(c, key, std::vector<char>(text.begin(), text.end()));
        if (c.out.size() == before)
          reply(c, Writer().u8(kOk).u64(static_cast<std::uint64_t>(value)));
        wake_parked();
        return;
      }
      default:
        throw std::runtime_error("unknown store request");
    }
  }

  // Runs every complete request buffered for `c` (one at a time while a wait is parked).
  void process(Client& c) {
    std::size_t pos = 0;
    while (!c.parked && !c.closing && c.in.size() - pos >= 4) {
      std::uint32_t n;
      std::memcpy(&n, c.in.data() + pos, 4);
      if (n > kStoreMaxMessageBytes) {
        reply_error(c, "request of " + std::to_string(n) + " bytes exceeds the store's limit");
        c.closing = true;
        break;
      }
      if (c.in.size() - pos - 4 < n) break;
      try {
        handle(c, c.in.data() + pos + 4, n);
      } catch (const std::exception& e) {
        reply_error(c, std::string("bad request: ") + e.what());
        c.closing = true;
      }
      pos += 4 + n;
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
  }

  // False when the connection failed. At the end of the peer's stream (it closed, or shut down
  // its sending side) the requests it sent before are still served: a worker that sets a key and
  // exits at once must not lose the key.
  bool read_from(int fd, Client& c) {
    char buf[64 * 1024];
    for (;;) {
      const ssize_t rv = ::recv(fd, buf, sizeof buf, 0);
      if (rv > 0) {
        c.in.insert(c.in.end(), buf, buf + rv);
        if (c.in.size() > kStoreMaxMessageBytes + 64) c.closing = true;  // a peer that never frames
        continue;
      }
      if (rv == 0) {
        c.hung_up = true;
        return true;
      }
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
  }

  bool flush(int fd, Client& c) {
    while (c.out_sent < c.out.size()) {
      const ssize_t rv =
          ::send(fd, c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (rv > 0) {
        c.out_sent += static_cast<std::size_t>(rv);
      } else if (rv < 0 && errno == EINTR) {
        continue;
      } else {
        return rv < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      }
    }
    c.out.clear();
    c.out_sent = 0;
    return !c.closing;
  }

  void run() {
    for (;;) {
      std::vector<pollfd> fds{{wake_fd, POLLIN, 0}, {listen_fd, POLLIN, 0}};
      Clock::time_point next = Clock::time_point::max();
      for (auto& [fd, c] : clients) {
        fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
        if (c.parked) next = std::min(next, c.wait.deadline);
      }
      const int timeout = next == Clock::time_point::max() ? -1 : remaining_ms(next) + 1;
      if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) return;
      if (fds[1].revents & POLLIN) {
        for (;;) {
          const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          clients.emplace(fd, Client{});
        }
      }
      std::vector<int> gone;
      for (std::size_t i = 2; i < fds.size(); ++i) {
        const int fd = fds[i].fd;
        auto it = clients.find(fd);
        if (it == clients.end()) continue;
        Client& c = it->second;
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && !read_from(fd, c)) {
          gone.push_back(fd);
          continue;
        }
        process(c);
        // Its replies go out as far as the socket takes them (a half-closed peer still reads);
        // a wait it left parked has nobody to answer.
        if (c.hung_up) c.closing = true;
      }
      const auto now = Clock::now();
      for (auto& [fd, c] : clients) {
        if (c.parked && c.wait.deadline <= now) reply_parked(c, true);
        if (!c.parked) process(c);  // requests that queued behind a parked one
      }
      for (auto& [fd, c] : clients) {
        if (std::find(gone.begin(), gone.end(), fd) == gone.end() && !flush(fd, c))
          gone.push_back(fd);
      }
      for (int fd : gone) {
        ::close(fd);
        clients.erase(fd);
      }
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port)
    : impl_(std::make_unique<Impl>()) {
  const HostPort where{host, port};
  const std::string what =
      "rendezvous store on " + (host.empty() ? "*:" + std::to_string(port) : where.str());
  std::string error;
  addrinfo* res = resolve(where, true, &error);
  if (res == nullptr) throw CommError(what + ": " + error);
  for (addrinfo* ai = res; ai != nullptr && impl_->listen_fd < 0; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 512) == 0) {
      impl_->listen_fd = fd;
    } else {
      error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (impl_->listen_fd < 0) throw CommError(what + ": cannot listen: " + error);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  impl_->port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC);
  if (impl_->wake_fd < 0) throw CommError(what + ": eventfd: " + std::strerror(errno));
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t rv = ::write(impl_->wake_fd, &one, sizeof one);
  impl_->thread.join();
}

int TcpStoreServer::port() const { return impl_->port; }

// ---- client --------------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& host, int port, Milliseconds timeout)
    : Store(timeout), where_{host, port} {
  // Rank 0 may still be starting its server: retry with a growing pause until the timeout.
  const auto deadline = Clock::now() + timeout;
  std::string error = "no attempt";
  auto pause = Milliseconds(20);
  for (;;) {
    fd_ = try_connect(where_, deadline, &error);
    if (fd_ >= 0) return;
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, Milliseconds(500));
  }
  throw CommError("rendezvous " + where_.str() + ": no store answered within " +
                  seconds_text(timeout) + " (last error: " + error + ")");
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<char> TcpStore::call(const std::vector<char>& request, Milliseconds reply_within) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string what = "rendezvous " + where_.str();
  if (fd_ < 0) throw CommError(what + ": the connection to the store was lost earlier");
  const auto deadline = Clock::now() + std::min(reply_within, kMaxWait);
  const auto fail = [&](const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    return CommError(what + ": " + why);
  };
  if (!write_all(fd_, request.data(), request.size(), deadline)) {
    throw fail(std::string("cannot send to the store (") + std::strerror(errno) + ")");
  }
  std::uint32_t n = 0;
  ReadResult rr = read_exact(fd_, reinterpret_cast<char*>(&n), 4, deadline);
  std::vector<char> body;
  if (rr == ReadResult::kOk) {
    if (n > kStoreMaxMessageBytes)
      throw fail("reply of " + std::to_string(n) + " bytes exceeds the limit");
    body.resize(n);
    rr = read_exact(fd_, body.data(), n, deadline);
  }
  if (rr == ReadResult::kClosed)
    throw fail("the store closed the connection (its process exited?)");
  if (rr == ReadResult::kTimeout) {
    throw fail("no reply from the store within " + seconds_text(reply_within));
  }
  if (body.empty()) throw fail("empty reply from the store");
  if (static_cast<std::uint8_t>(body[0]) == kError) {
    Reader r(body.data() + 1, body.size() - 1);
    throw CommError(what + ": " + r.str());
  }
  return body;
}

namespace {

void check_key(const std::string& key) {
  if (key.size() > kStoreMaxKeyBytes) {
    throw std::invalid_argument("store key of " + std::to_string(key.size()) + " bytes (at most " +
                                std::to_string(kStoreMaxKeyBytes) + ")");
  }
}

// Parked requests are answered at their deadline; allow for the round trip on top.
Milliseconds reply_slack(Milliseconds timeout) { return timeout + Milliseconds(2000); }

std::uint64_t wire_timeout(Milliseconds t) {
  return static_cast<std::uint64_t>(std::clamp(t, Milliseconds(0), kMaxWait).count());
}

}  // namespace

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  check_key(key);
  Writer w;
  w.u8(kSet).str(key).bytes(data.data(), data.size());
  if (w.size() > kStoreMaxMessageBytes) {
    throw std::invalid_argument("store value of " + std::to_string(data.size()) + " bytes for '" +
                                key + "' exceeds the limit of " +
                                std::to_string(kStoreMaxMessageBytes) + " bytes");
  }
  call(w.frame(), timeout_);
}

std::vector<char> TcpStore::get(const std::string& key) {
  check_key(key);
  Writer w;
  w.u8(kGet).u64(wire_timeout(timeout_)).str(key);
  const std::vector<char> body = call(w.frame(), reply_slack(Milliseconds(wire_timeout(timeout_))));
  if (static_cast<std::uint8_t>(body[0]) == kTimeout) {
    throw CommError("rendezvous " + where_.str() + ": key '" + key + "' not set within " +
                    seconds_text(timeout_));
  }
  Reader r(body.data() + 1, body.size() - 1);
  return r.bytes();
}

std::vector<std::string> TcpStore::missing(const std::vector<std::string>& keys,
                                           Milliseconds timeout) {
  Writer w;
  w.u8(kWait).u64(wire_timeout(timeout));
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) {
    check_key(k);
    w.str(k);
  }
  const std::vector<char> body = call(w.frame(), reply_slack(Milliseconds(wire_timeout(timeout))));
  std::vector<std::string> out;
  if (static_cast<std::uint8_t>(body[0]) == kTimeout) {
    Reader r(body.data() + 1, body.size() - 1);
    const std::uint32_t m = r.u32();
    for (std::uint32_t i = 0; i < m; ++i) out.push_back(r.str());
  }
  return out;
}

void TcpStore::wait(const std::vector<std::string>& keys, const Milliseconds& timeout) {
  const std::vector<std::string> absent = missing(keys, timeout);
  if (!absent.empty()) {
    throw CommError("rendezvous " + where_.str() + ": key(s) " + join_keys(absent) +
                    " not set within " + seconds_text(timeout));
  }
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return missing(keys, Milliseconds(0)).empty();
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  check_key(key);
  Writer w;
  w.u8(kAdd).str(key).u64(static_cast<std::uint64_t>(delta));
  const std::vector<char> body = call(w.frame(), timeout_);
  Reader r(body.data() + 1, body.size() - 1);
  return static_cast<std::int64_t>(r.u64());
}

// ---- FileStore -----------------------------------------------------------------------------

// gloo's FileStore names the files (a hash of each key); reads, writes and waits are ours because
// its wait counts its timeout in whole seconds and its set refuses to overwrite a key.
struct FileStore::Files : gloo::rendezvous::FileStore {
  using gloo::rendezvous::FileStore::FileStore;
  using gloo::rendezvous::FileStore::objectPath;
  using gloo::rendezvous::FileStore::tmpPath;
};

namespace {

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// Writes through a temporary file and a rename, so readers never see half a value.
void write_replace(const std::string& tmp, const std::string& path, const char* data,
                   std::size_t n) {
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw CommError(errno_text("rendezvous: cannot create", tmp));
    out.write(data, static_cast<std::streamsize>(n));
    if (!out) throw CommError(errno_text("rendezvous: cannot write", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw CommError(errno_text("rendezvous: cannot rename", tmp));
}

std::vector<char> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CommError(errno_text("rendezvous: cannot open", path));
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

FileStore::FileStore(const std::string& directory, Milliseconds timeout) : Store(timeout) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (!std::filesystem::is_directory(directory)) {
    throw CommError("rendezvous directory " + directory + ": not a directory" +
                    (ec ? " (" + ec.message() + ")" : std::string()));
  }
  directory_ = std::filesystem::canonical(directory).string();
  files_ = std::make_unique<Files>(directory_);
}

FileStore::~FileStore() = default;

void FileStore::set(const std::string& key, const std::vector<char>& data) {
  const std::string tmp = files_->tmpPath(key) + "." + std::to_string(::getpid());
  write_replace(tmp, files_->objectPath(key), data.data(), data.size());
}

std::vector<char> FileStore::get(const std::string& key) {
  wait({key}, timeout_);
  return read_whole(files_->objectPath(key));
}

bool FileStore::check(const std::vector<std::string>& keys) {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) {
    return ::access(files_->objectPath(k).c_str(), F_OK) == 0;
  });
}

void FileStore::wait(const std::vector<std::string>& keys, const Milliseconds& timeout) {
  // Polling, not inotify: inotify misses changes made by other hosts on shared filesystems.
  const auto deadline = Clock::now() + std::min(timeout, kMaxWait);
  while (!check(keys)) {
    if (Clock::now() >= deadline) {
      std::vector<std::string> absent;
      for (const auto& k : keys)
        if (!check({k})) absent.push_back(k);
      throw CommError("rendezvous " + directory_ + ": key(s) " + join_keys(absent) +
                      " not set within " + seconds_text(timeout));
    }
    std::this_thread::sleep_for(Milliseconds(5));
  }
}

std::int64_t FileStore::add(const std::string& key, std::int64_t delta) {
  const std::string path = files_->objectPath(key);
  const std::string lock_path = path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw CommError(errno_text("rendezvous: cannot open", lock_path));
  if (::flock(fd, LOCK_EX) != 0) {
    ::close(fd);
    throw CommError(errno_text("rendezvous: cannot lock", lock_path));
  }
  std::int64_t value = 0;
  try {
    if (::access(path.c_str(), F_OK) == 0) {
      const std::vector<char> v = read_whole(path);
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
      if (ec != std::errc() || end != v.data() + v.size()) {
        throw CommError("rendezvous " + directory_ + ": add: key '" + key +
                        "' does not hold an integer");
      }
    }
    value += delta;
    const std::string text = std::to_string(value);
    write_replace(files_->tmpPath(key) + ".add." + std::to_string(::getpid()), path, text.data(),
                  text.size());
  } catch (...) {
    ::close(fd);  // releases the lock
    throw;
  }
  ::close(fd);
  return value;
}

}  // namespace hpm::comm
