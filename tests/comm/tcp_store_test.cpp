// The rendezvous stores: the TCP store's protocol end to end on 127.0.0.1 (set/get/wait/check/add,
// blocking gets answered when another client sets the key, timeouts naming the missing keys,
// connect retries while the server starts, a server that goes away, limits and malformed
// requests), HOST:PORT parsing, and the FileStore's counter across processes.
#include <arpa/inet.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>

#include "common/errors.h"
#include "common/temp_dir.h"
#include "hpm/comm/store.h"

namespace hpm::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using hpm::testing::contains;
using hpm::testing::error_of;

std::vector<char> bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }
std::string text(const std::vector<char>& v) { return std::string(v.begin(), v.end()); }

// A client that speaks the wire format by hand (-1 if it cannot connect).
int connect_raw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends until it closes the connection.
std::string read_until_closed(int fd) {
  std::string reply;
  char buf[256];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    reply.append(buf, static_cast<std::size_t>(n));
  return reply;
}

TEST(TcpStoreTest, SetGetCheckAndBinaryValues) {
  TcpStoreServer server("127.0.0.1", 0);
  ASSERT_GT(server.port(), 0);
  TcpStore store("127.0.0.1", server.port(), 2s);
  EXPECT_EQ(store.address(), "127.0.0.1:" + std::to_string(server.port()));
  EXPECT_FALSE(store.check({"a"}));
  const std::vector<char> binary{'\0', '\xff', 'x', '\0'};
  store.set("a", binary);
  store.set("empty", {});
  EXPECT_EQ(store.get("a"), binary);
  EXPECT_TRUE(store.get("empty").empty());
  EXPECT_TRUE(store.check({"a", "empty"}));
  EXPECT_FALSE(store.check({"a", "b"}));
  store.set("a", bytes("replaced"));
  EXPECT_EQ(text(store.get("a")), "replaced");
  // A second client sees the first one's keys.
  TcpStore other("127.0.0.1", server.port(), 2s);
  EXPECT_EQ(text(other.get("a")), "replaced");
}

TEST(TcpStoreTest, BlockingGetIsAnsweredWhenAnotherClientSetsTheKey) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore waiter("127.0.0.1", server.port(), 5s);
  TcpStore setter("127.0.0.1", server.port(), 5s);
  const auto t0 = Clock::now();
  std::thread later([&] {
    std::this_thread::sleep_for(150ms);
    setter.set("late", bytes("here"));
  });
  EXPECT_EQ(text(waiter.get("late")), "here");
  const auto took = Clock::now() - t0;
  later.join();
  EXPECT_GE(took, 140ms);
  EXPECT_LT(took, 1s);  // answered on arrival, not at the timeout
  // wait() for several keys, one of them set later.
  std::thread again([&] {
    std::this_thread::sleep_for(50ms);
    setter.set("k2", bytes("2"));
  });
  setter.set("k1", bytes("1"));
  waiter.wait({"k1", "k2"}, 2000ms);
  again.join();
}

TEST(TcpStoreTest, TimeoutsNameTheMissingKeys) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server.port(), 300ms);
  store.set("here", bytes("1"));
  const auto t0 = Clock::now();
  const std::string e = error_of([&] { store.wait({"here", "absent1", "absent2"}, 200ms); });
  EXPECT_TRUE(contains(e, "key(s) 'absent1', 'absent2' not set within 200 ms")) << e;
  EXPECT_FALSE(contains(e, "'here'")) << e;
  EXPECT_TRUE(contains(e, "rendezvous 127.0.0.1:")) << e;
  EXPECT_GE(Clock::now() - t0, 190ms);
  const std::string g = error_of([&] { store.get("nope"); });
  EXPECT_TRUE(contains(g, "key 'nope' not set within 300 ms")) << g;
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_TRUE(store.missing({"here", "nope"}, 0ms) == std::vector<std::string>{"nope"});
  // The connection is still usable after timeouts.
  EXPECT_EQ(text(store.get("here")), "1");
}

TEST(TcpStoreTest, AddIsAtomicAcrossClients) {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kClients = 6, kAdds = 100;
  std::vector<std::thread> threads;
  std::atomic<int> sevens{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&] {
      TcpStore store("127.0.0.1", server.port(), 5s);
      for (int i = 0; i < kAdds; ++i)
        if (store.add("counter", 1) == 7) ++sevens;
    });
  }
  for (auto& t : threads) t.join();
  TcpStore store("127.0.0.1", server.port(), 5s);
  EXPECT_EQ(store.add("counter", 0), kClients * kAdds);
  EXPECT_EQ(sevens.load(), 1);  // every intermediate sum was returned to exactly one caller
  EXPECT_EQ(text(store.get("counter")), std::to_string(kClients * kAdds));
  EXPECT_EQ(store.add("negative", -5), -5);
  store.set("word", bytes("abc"));
  EXPECT_TRUE(contains(error_of([&] { store.add("word", 1); }), "does not hold an integer"));
  // Found by fuzz/tcp_store_fuzz.cpp: a sum past 2^63 - 1 was signed overflow in the server. It is
  // refused, the value is kept, and the server goes on serving.
  store.set("big", bytes("9223372036854775800"));
  EXPECT_TRUE(contains(error_of([&] { store.add("big", 8); }),
                       "add: key 'big' would overflow a 64-bit integer (9223372036854775800 + 8)"));
  EXPECT_TRUE(contains(error_of([&] { store.add("negative", INT64_MIN); }), "would overflow"));
  EXPECT_EQ(store.add("big", 7), INT64_MAX);
  EXPECT_EQ(store.add("negative", 0), -5);
}

TEST(TcpStoreTest, ClientRetriesUntilTheServerStarts) {
  int port = 0;
  {
    TcpStoreServer probe("127.0.0.1", 0);  // a port that was free a moment ago
    port = probe.port();
  }
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port);
  });
  const auto t0 = Clock::now();
  TcpStore store("127.0.0.1", port, 5s);
  EXPECT_GE(Clock::now() - t0, 250ms);
  starter.join();
  store.set("x", bytes("y"));
  EXPECT_EQ(text(store.get("x")), "y");
}

TEST(TcpStoreTest, NoServerFailsWithinTheTimeout) {
  int port = 0;
  {
    TcpStoreServer probe("127.0.0.1", 0);
    port = probe.port();
  }
  const auto t0 = Clock::now();
  const std::string e = error_of([&] { TcpStore("127.0.0.1", port, 700ms); });
  const auto took = Clock::now() - t0;
  EXPECT_EQ(e, "rendezvous 127.0.0.1:" + std::to_string(port) +
                   ": no store answered within 700 ms (last error: Connection refused)");
  EXPECT_GE(took, 690ms);
  EXPECT_LT(took, 1500ms);
}

TEST(TcpStoreTest, ServerThatGoesAwayFailsCallsPromptly) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server->port(), 5s);
  store.set("a", bytes("1"));
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server.reset();
  });
  const auto t0 = Clock::now();
  const std::string e = error_of([&] { store.get("never"); });  // parked when the server stops
  stopper.join();
  EXPECT_TRUE(contains(e, "the store closed the connection")) << e;
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_TRUE(contains(error_of([&] { store.set("b", bytes("2")); }), "lost earlier"));
}

TEST(TcpStoreTest, LimitsAndMalformedRequests) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server.port(), 2s);
  EXPECT_THROW(store.set(std::string(kStoreMaxKeyBytes + 1, 'k'), bytes("v")),
               std::invalid_argument);
  EXPECT_THROW(store.set("big", std::vector<char>(kStoreMaxMessageBytes + 1)),
               std::invalid_argument);

  // A raw client that sends an oversized frame, then one that sends garbage: each gets an error
  // reply and is dropped; the server keeps serving everyone else.
  for (const std::vector<char>& frame : {std::vector<char>{'\xff', '\xff', '\xff', '\x7f'},
                                         std::vector<char>{3, 0, 0, 0, 99, 1, 2}}) {
    const int fd = connect_raw(server.port());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
    const std::string reply = read_until_closed(fd);
    ::close(fd);
    ASSERT_GT(reply.size(), 5u);
    EXPECT_EQ(reply[4], 2) << "an error status";
  }
  store.set("still", bytes("serving"));
  EXPECT_EQ(text(store.get("still")), "serving");
}

// A client that sends its requests and closes its side at once (a worker that publishes a key
// and exits): the server serves what arrived before the end of the stream, and still replies.
TEST(TcpStoreTest, RequestsSentJustBeforeAHangUpAreServed) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server.port(), 2s);
  const auto set_frame = [](const std::string& key, const std::string& value) {
    // Little-endian lengths, as the store's client writes them on x86.
    const auto length = [](std::size_t n) {
      std::string le(4, '\0');
      for (int b = 0; b < 4; ++b) le[static_cast<std::size_t>(b)] = static_cast<char>(n >> (8 * b));
      return le;
    };
    const std::string body =
        std::string(1, '\1') + length(key.size()) + key + length(value.size()) + value;  // set
    const std::string frame = length(body.size()) + body;
    return std::vector<char>(frame.begin(), frame.end());
  };
  for (const bool half : {true, false}) {
    SCOPED_TRACE(half ? "shutdown(SHUT_WR)" : "close");
    const std::string key = half ? "half" : "closed";
    const int fd = connect_raw(server.port());
    ASSERT_GE(fd, 0);
    std::vector<char> frames = set_frame(key + "1", "a");
    const std::vector<char> second = set_frame(key + "2", "b");
    frames.insert(frames.end(), second.begin(), second.end());
    ASSERT_EQ(::send(fd, frames.data(), frames.size(), 0), static_cast<ssize_t>(frames.size()));
    if (half) {
      ::shutdown(fd, SHUT_WR);
      EXPECT_EQ(read_until_closed(fd).size(), 10u)
          << "two replies of a length and a status byte each";
    }
    ::close(fd);
    EXPECT_EQ(text(store.get(key + "1")), "a");
    EXPECT_EQ(text(store.get(key + "2")), "b");
  }
}

TEST(TcpStoreTest, WorksUnderGlooPrefixStore) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server.port(), 2s);
  gloo::rendezvous::PrefixStore prefixed("job7", store);
  prefixed.set("0", bytes("address"));
  EXPECT_EQ(text(store.get("job7/0")), "address");
  prefixed.wait({"0"}, 100ms);
  EXPECT_THROW(prefixed.wait({"1"}, 100ms), CommError);
}

TEST(HostPortTest, ParsesAndRejects) {
  EXPECT_EQ(parse_host_port("10.0.0.1:29500").host, "10.0.0.1");
  EXPECT_EQ(parse_host_port("10.0.0.1:29500").port, 29500);
  EXPECT_EQ(parse_host_port("node-1.cluster:0").port, 0);
  EXPECT_EQ(parse_host_port("[::1]:80").host, "::1");
  EXPECT_EQ(parse_host_port("[::1]:80").str(), "[::1]:80");
  for (const char* bad : {"10.0.0.1", "10.0.0.1:", ":80", "h:port", "h:65536", "h:-1", "[::1:80"}) {
    const std::string e = error_of([&] { parse_host_port(bad); });
    EXPECT_TRUE(contains(e, std::string("rendezvous address '") + bad + "'")) << bad << ": " << e;
  }
}

TEST(FileStoreTest, SetGetWaitCheck) {
  hpm::testing::TempDir dir;
  FileStore store(dir / "nested/store", 300ms);  // created on demand
  EXPECT_FALSE(store.check({"k"}));
  store.set("k", bytes("v1"));
  store.set("k", bytes("v2"));  // unlike gloo's FileStore, overwriting is allowed
  EXPECT_EQ(text(store.get("k")), "v2");
  EXPECT_TRUE(store.check({"k"}));
  const auto t0 = Clock::now();
  const std::string e = error_of([&] { store.wait({"k", "missing"}, 100ms); });
  EXPECT_TRUE(contains(e, "key(s) 'missing' not set within 100 ms")) << e;
  EXPECT_LT(Clock::now() - t0, 600ms);  // milliseconds, not gloo's whole seconds
  EXPECT_TRUE(contains(error_of([&] { store.get("absent"); }), "not set within 300 ms"));
}

// Processes sharing the directory count with add() under an flock: no increment is lost.
TEST(FileStoreTest, AddIsAtomicAcrossProcesses) {
  hpm::testing::TempDir dir;
  constexpr int kProcs = 4, kAdds = 50;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        FileStore store(dir.path(), 5s);
        for (int i = 0; i < kAdds; ++i) store.add("count", 1);
      } catch (...) {
        code = 1;
      }
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  FileStore store(dir.path(), 1s);
  EXPECT_EQ(store.add("count", 0), kProcs * kAdds);
  EXPECT_EQ(text(store.get("count")), std::to_string(kProcs * kAdds));
}

}  // namespace
}  // namespace hpm::comm
