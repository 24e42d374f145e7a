// The gloo backend across real processes. Each test forks one child per rank before it creates
// any thread; the children build gloo communicators over a FileStore in a temporary directory or
// over the TCP store on 127.0.0.1, report back through a pipe, and _exit.
//
// Covered: every collective against closed forms (rank r contributes r + 1 + i to element i,
// exact in float32) for 1, 7, 4K and 1M+3 floats, world sizes 2 and 3, every all-reduce
// algorithm; send/recv with two tags interleaved, and a send that must not wait behind an
// all-reduce; a rank SIGKILLed in the middle of large all-reduces (the survivors fail within the
// timeout naming it), a rank that hangs, a rank that never arrives at rendezvous.
#include "hpm/comm/gloo.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>

#include "common/errors.h"
#include "common/temp_dir.h"
#include "hpm/tensor/kernels.h"

namespace hpm::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using hpm::testing::contains;
using hpm::testing::TempDir;

// ---- processes -------------------------------------------------------------------------------

struct RankResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string report;
  Clock::time_point ended;
};

// Forks one process per entry of `ranks`, running body(rank); what body returns (or the message of
// what it throws) comes back as the report. Ranks in `stragglers` are SIGKILLed once all others
// have exited; everything still running after `limit` is SIGKILLed and reported as hung.
std::vector<RankResult> run_ranks(const std::vector<int>& ranks,
                                  const std::function<std::string(int)>& body,
                                  const std::set<int>& stragglers = {},
                                  std::chrono::seconds limit = 40s) {
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int rank : ranks) {
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      for (int fd : fds) ::close(fd);
      std::string report;
      int code = 0;
      try {
        report = body(rank);
      } catch (const std::exception& e) {
        report = std::string("exception: ") + e.what();
        code = 3;
      }
      for (std::size_t off = 0; off < report.size();) {
        const ssize_t n = ::write(p[1], report.data() + off, report.size() - off);
        if (n <= 0) break;
        off += static_cast<std::size_t>(n);
      }
      ::_exit(code);
    }
    ::close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  std::vector<RankResult> results(ranks.size());
  std::vector<bool> done(ranks.size(), false);
  const auto deadline = Clock::now() + limit;
  for (;;) {
    std::vector<pollfd> pfds;
    for (int fd : fds) pfds.push_back({fd, POLLIN, 0});
    ::poll(pfds.data(), pfds.size(), 2);
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] >= 0 && (pfds[i].revents & (POLLIN | POLLHUP))) {
        char buf[4096];
        const ssize_t n = ::read(fds[i], buf, sizeof buf);
        if (n > 0) {
          results[i].report.append(buf, static_cast<std::size_t>(n));
        } else {
          ::close(fds[i]);
          fds[i] = -1;
        }
      }
    }
    bool others_done = true, all_done = true;
    for (std::size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (!done[i] && ::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        results[i].ended = Clock::now();
        if (WIFEXITED(status)) results[i].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[i].signal = WTERMSIG(status);
      }
      all_done = all_done && done[i];
      if (!stragglers.count(ranks[i])) others_done = others_done && done[i];
    }
    if (all_done && std::all_of(fds.begin(), fds.end(), [](int fd) { return fd < 0; })) break;
    for (std::size_t i = 0; i < pids.size(); ++i) {
      const bool straggler = others_done && stragglers.count(ranks[i]);
      if (!done[i] && (straggler || Clock::now() > deadline)) {
        if (!straggler) results[i].report += " [HUNG: killed by the test]";
        ::kill(pids[i], SIGKILL);
        ::kill(pids[i], SIGCONT);
      }
    }
  }
  return results;
}

// A port nobody listens on right now, for rank 0's store (chosen before the fork).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

enum class StoreKind { kFile, kTcp };

// Rendezvous for one group: a fresh directory or a fresh port.
struct Group {
  StoreKind kind;
  int world;
  Milliseconds timeout;
  TempDir dir;
  std::string rendezvous;

  Group(StoreKind k, int w, Milliseconds t) : kind(k), world(w), timeout(t) {
    rendezvous = k == StoreKind::kFile ? dir / "store" : "127.0.0.1:" + std::to_string(free_port());
  }
  CommunicatorPtr connect(int rank) const {
    GlooOptions o;
    o.rank = rank;
    o.world_size = world;
    o.rendezvous = rendezvous;
    o.timeout = timeout;
    return make_gloo_communicator(o);
  }
  std::vector<int> all_ranks() const {
    std::vector<int> r(static_cast<std::size_t>(world));
    for (int i = 0; i < world; ++i) r[static_cast<std::size_t>(i)] = i;
    return r;
  }
};

// ---- closed forms ----------------------------------------------------------------------------

// Rank r holds r + 1 + (offset + i) at element i: integers below 2^24, so sums are exact.
Tensor contribution(int rank, std::int64_t n, std::int64_t offset = 0) {
  Tensor t = Tensor::empty({n});
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(rank + 1 + offset + i);
  return t;
}

float reduced(ReduceOp op, int world, std::int64_t i) {
  const std::int64_t sum = world * (world + 1) / 2 + world * i;
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<float>(sum);
    case ReduceOp::kMax:
      return static_cast<float>(world + i);
    case ReduceOp::kAverage:
      return static_cast<float>(sum) * (1.0f / static_cast<float>(world));
  }
  return 0;
}

// "" when t[i] == expected(i) for all i, else the first difference.
std::string mismatch(const Tensor& t, const std::function<float(std::int64_t)>& expected) {
  const float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (p[i] != expected(i)) {
      return "element " + std::to_string(i) + " is " + std::to_string(p[i]) + ", expected " +
             std::to_string(expected(i));
    }
  }
  return "";
}

TEST(GlooTest, CheckerCatchesAWrongValue) {
  Tensor t = contribution(0, 7);
  for (std::int64_t i = 0; i < 7; ++i) t.data<float>()[i] = reduced(ReduceOp::kSum, 2, i);
  EXPECT_EQ(mismatch(t, [](std::int64_t i) { return reduced(ReduceOp::kSum, 2, i); }), "");
  t.data<float>()[5] += 1;
  EXPECT_EQ(mismatch(t, [](std::int64_t i) { return reduced(ReduceOp::kSum, 2, i); }),
            "element 5 is 14.000000, expected 13.000000");
}

// Every collective of one rank, checked; "ok" or what went wrong.
std::string exercise_collectives(Communicator& c) {
  const int world = c.size(), r = c.rank();
  for (std::int64_t n :
       {std::int64_t{1}, std::int64_t{7}, std::int64_t{4096}, std::int64_t{(1 << 20) + 3}}) {
    const std::string at = " n=" + std::to_string(n) + " on rank " + std::to_string(r) + ": ";
    for (Algorithm a :
         {Algorithm::kAuto, Algorithm::kDirect, Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
      c.set_algorithm(a);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        Tensor t = contribution(r, n);
        c.allreduce(t, op)->wait();
        const std::string bad = mismatch(t, [&](std::int64_t i) { return reduced(op, world, i); });
        if (!bad.empty()) {
          return std::string("allreduce ") + algorithm_name(a) + " " + reduce_op_name(op) + at +
                 bad;
        }
      }
    }
    c.set_algorithm(Algorithm::kAuto);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      Tensor out = Tensor::empty({n});
      c.reduce_scatter(contribution(r, n * world), out, op)->wait();
      const std::string bad =
          mismatch(out, [&](std::int64_t i) { return reduced(op, world, r * n + i); });
      if (!bad.empty()) return std::string("reduce_scatter ") + reduce_op_name(op) + at + bad;
    }
    Tensor gathered = Tensor::empty({n * world});
    c.allgather(contribution(r, n), gathered)->wait();
    std::string bad =
        mismatch(gathered, [&](std::int64_t i) { return static_cast<float>(i / n + 1 + i % n); });
    if (!bad.empty()) return "allgather" + at + bad;
    for (int root = 0; root < world; ++root) {
      Tensor t = r == root ? contribution(root, n) : Tensor::full({n}, -1.0f);
      c.broadcast(t, root)->wait();
      bad = mismatch(t, [&](std::int64_t i) { return static_cast<float>(root + 1 + i); });
      if (!bad.empty()) return "broadcast from " + std::to_string(root) + at + bad;
    }
  }
  c.barrier()->wait();
  return "ok";
}

// Three messages to the next rank on tags 1, 2, 1 (sizes 5, 9, 5), received from the previous one
// in the other order: tag 2 first, then both tag-1 messages, which must arrive in order.
std::string exercise_send_recv(Communicator& c) {
  const int world = c.size(), r = c.rank();
  const int next = (r + 1) % world, prev = (r + world - 1) % world;
  Tensor a = Tensor::full({5}, 100.0f * r + 1), b = Tensor::full({9}, 100.0f * r + 2),
         d = Tensor::full({5}, 100.0f * r + 3);
  auto s1 = c.send(a, next, 1);
  auto s2 = c.send(b, next, 2);
  auto s3 = c.send(d, next, 1);
  Tensor rb = Tensor::empty({9}), ra = Tensor::empty({5}), rd = Tensor::empty({5});
  c.recv(rb, prev, 2)->wait();
  auto r1 = c.recv(ra, prev, 1);
  auto r3 = c.recv(rd, prev, 1);
  for (const auto& w : {r1, r3, s1, s2, s3}) w->wait();
  for (auto [t, v] : {std::pair{rb, 2}, std::pair{ra, 1}, std::pair{rd, 3}}) {
    const std::string bad =
        mismatch(t, [&](std::int64_t) { return 100.0f * prev + static_cast<float>(v); });
    if (!bad.empty())
      return "message " + std::to_string(v) + " from rank " + std::to_string(prev) + ": " + bad;
  }
  return "ok";
}

// ---- correctness -----------------------------------------------------------------------------

struct GroupCase {
  StoreKind store;
  int world;
};

class GlooCollectivesTest : public ::testing::TestWithParam<GroupCase> {};

TEST_P(GlooCollectivesTest, MatchClosedFormsAndSendRecvKeepsTagOrder) {
  const Group g(GetParam().store, GetParam().world, 20s);
  const auto results = run_ranks(g.all_ranks(), [&](int rank) {
    auto c = g.connect(rank);
    if (c->rank() != rank || c->size() != g.world || c->backend() != "gloo")
      return std::string("bad identity");
    const std::string collectives = exercise_collectives(*c);
    if (collectives != "ok") return collectives;
    return exercise_send_recv(*c);
  });
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].report;
    EXPECT_EQ(results[r].report, "ok") << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Groups, GlooCollectivesTest,
    ::testing::Values(GroupCase{StoreKind::kFile, 2}, GroupCase{StoreKind::kFile, 3},
                      GroupCase{StoreKind::kTcp, 2}, GroupCase{StoreKind::kTcp, 3}),
    [](const auto& info) {
      return std::string(info.param.store == StoreKind::kFile ? "FileStore" : "TcpStore") +
             std::to_string(info.param.world);
    });

// bf16 all-reduces (what [strategy] allreduce_dtype = "bf16" sends): sums, averages and maxima of
// values whose partial sums are exact in bf16 equal the closed form exactly, under every
// algorithm; a sum that must round rounds to nearest even; other dtypes are refused.
TEST(GlooTest, Bf16AllReducesMatchClosedForms) {
  const Group g(StoreKind::kFile, 3, 20s);
  const auto results = run_ranks(g.all_ranks(), [&](int rank) {
    auto c = g.connect(rank);
    for (Algorithm a :
         {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kDirect}) {
      c->set_algorithm(a);
      for (std::int64_t n : {1, 7, 5000}) {
        // Rank r contributes (r + 1) * (i % 8): integers, exact in bf16 up to 256.
        std::vector<float> mine(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) mine[i] = static_cast<float>((rank + 1) * (i % 8));
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
          Tensor t = kernels::to_bf16(Tensor::from(mine, Shape{n}));
          c->allreduce(t, op)->wait();
          const std::vector<float> got = kernels::to_f32(t).to_vector();
          for (std::int64_t i = 0; i < n; ++i) {
            const float k = static_cast<float>(i % 8);
            const float want =
                op == ReduceOp::kSum ? 6 * k : (op == ReduceOp::kAverage ? 2 * k : 3 * k);
            if (got[i] != want) {
              return "algorithm " + std::string(algorithm_name(a)) + ", n " + std::to_string(n) +
                     ", " + reduce_op_name(op) + ": element " + std::to_string(i) + " is " +
                     std::to_string(got[i]) + ", want " + std::to_string(want);
            }
          }
        }
      }
    }
    // 256 + 1 + 0 in any order: 257 is not a bf16 value (the spacing there is 2) and rounds to
    // even, 256; f32 would keep 257.
    Tensor t = kernels::to_bf16(Tensor::full({1}, rank == 0 ? 256.0f : (rank == 1 ? 1.0f : 0.0f)));
    c->allreduce(t, ReduceOp::kSum)->wait();
    if (kernels::to_f32(t).to_vector()[0] != 256.0f) return std::string("rounding");
    try {
      c->allreduce(Tensor::zeros({2}, DType::I64), ReduceOp::kSum);
      return std::string("an I64 all-reduce was accepted");
    } catch (const std::invalid_argument& e) {
      if (std::string(e.what()).find("only float32 and bfloat16") == std::string::npos)
        return std::string(e.what());
    }
    return std::string("ok");
  });
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].report;
    EXPECT_EQ(results[r].report, "ok") << "rank " << r;
  }
}

// Control data travels as what it is: allgather, broadcast, send and recv move any dtype.
TEST(GlooTest, BytesAndIntegersMoveUnchanged) {
  const Group g(StoreKind::kFile, 3, 10s);
  const auto results = run_ranks(g.all_ranks(), [&](int rank) {
    auto c = g.connect(rank);
    const std::string mine = "rank" + std::to_string(rank) + "\xff";
    Tensor all = Tensor::empty({static_cast<std::int64_t>(mine.size()) * 3}, DType::U8);
    c->allgather(Tensor::from_bytes(mine), all)->wait();
    if (all.to_bytes() != std::string("rank0\xffrank1\xffrank2\xff")) return all.to_bytes();
    const std::vector<std::int64_t> big{rank == 2 ? (std::int64_t{1} << 53) + 1 : 0, -7};
    Tensor b = Tensor::from_i64(big, {2});
    c->broadcast(b, 2)->wait();
    if (b.to_vector_i64() != std::vector<std::int64_t>{(std::int64_t{1} << 53) + 1, -7})
      return std::string("broadcast of I64");
    if (rank == 0) c->send(Tensor::from_bytes("hello"), 1, 3)->wait(3000ms);
    if (rank == 1) {
      Tensor got = Tensor::empty({5}, DType::U8);
      c->recv(got, 0, 3)->wait(3000ms);
      if (got.to_bytes() != "hello") return std::string("recv of bytes: ") + got.to_bytes();
    }
    return std::string("ok");
  });
  for (const auto& r : results) EXPECT_EQ(r.report, "ok");
}

// Rank 0 issues an all-reduce that cannot finish until rank 1 joins, then a send; rank 1 joins only
// after receiving it. Were sends queued behind collectives, this would deadlock.
TEST(GlooTest, SendDoesNotWaitBehindACollective) {
  const Group g(StoreKind::kFile, 2, 10s);
  const auto results = run_ranks(g.all_ranks(), [&](int rank) {
    auto c = g.connect(rank);
    Tensor x = contribution(rank, 1000), msg = Tensor::full({3}, 42.0f);
    if (rank == 0) {
      auto reduce = c->allreduce(x);
      c->send(msg, 1, 7)->wait(3000ms);
      reduce->wait();
    } else {
      Tensor got = Tensor::empty({3});
      c->recv(got, 0, 7)->wait(3000ms);
      if (got.data<float>()[2] != 42.0f) return std::string("wrong message");
      c->allreduce(x)->wait();
    }
    const std::string bad =
        mismatch(x, [&](std::int64_t i) { return reduced(ReduceOp::kSum, 2, i); });
    return bad.empty() ? std::string("ok") : bad;
  });
  for (const auto& r : results) EXPECT_EQ(r.report, "ok");
}

// ---- failures --------------------------------------------------------------------------------

struct KillCase {
  StoreKind store;
  Algorithm algorithm;
  int victim;
};

class GlooKillTest : public ::testing::TestWithParam<KillCase> {};

// Three ranks run large all-reduces; the victim SIGKILLs itself while one is in flight. The
// survivors must fail within the timeout with a CommError that names the operation and the victim,
// and every later call must fail at once.
TEST_P(GlooKillTest, SurvivorsNameTheDeadRankWithinTheTimeout) {
  const KillCase k = GetParam();
  const Group g(k.store, 3, 3000ms);
  const auto results = run_ranks(g.all_ranks(), [&](int rank) {
    auto c = g.connect(rank);
    c->set_algorithm(k.algorithm);
    Tensor big = contribution(rank, 1 << 20);
    for (int i = 0; i < 100000; ++i) {
      auto w = c->allreduce(big);
      if (rank == k.victim && i == 3) {
        std::this_thread::sleep_for(2ms);
        ::raise(SIGKILL);
      }
      try {
        w->wait();
      } catch (const CommError& e) {
        const auto t0 = Clock::now();
        try {
          c->allreduce(big)->wait();
          return std::string("a later allreduce succeeded");
        } catch (const CommError& later) {
          if (!contains(later.what(), "failed earlier"))
            return std::string("later: ") + later.what();
        }
        if (Clock::now() - t0 > 100ms) return std::string("the later allreduce took long to fail");
        return std::string(e.what());
      }
    }
    return std::string("no failure");
  });
  const RankResult& dead = results[static_cast<std::size_t>(k.victim)];
  EXPECT_EQ(dead.signal, SIGKILL) << dead.report;
  const std::string victim = "rank " + std::to_string(k.victim) + " (pid";
  for (int r = 0; r < 3; ++r) {
    if (r == k.victim) continue;
    const RankResult& s = results[static_cast<std::size_t>(r)];
    EXPECT_EQ(s.exit_code, 0);
    EXPECT_TRUE(contains(s.report, "gloo allreduce #")) << s.report;
    EXPECT_TRUE(contains(s.report, victim + " ") && contains(s.report, " is gone")) << s.report;
    const auto took = std::chrono::duration_cast<Milliseconds>(s.ended - dead.ended);
    EXPECT_LT(took, g.timeout + 1000ms)
        << "rank " << r << " failed " << took.count() << " ms after the kill";
  }
}

INSTANTIATE_TEST_SUITE_P(Victims, GlooKillTest,
                         ::testing::Values(KillCase{StoreKind::kFile, Algorithm::kRing, 2},
                                           KillCase{StoreKind::kTcp, Algorithm::kDirect, 1},
                                           KillCase{StoreKind::kTcp, Algorithm::kRecursiveDoubling,
                                                    0}),
                         [](const auto& info) {
                           return std::string(info.param.store == StoreKind::kFile ? "FileStore"
                                                                                   : "TcpStore") +
                                  "Rank" + std::to_string(info.param.victim);
                         });

// A rank that stops (SIGSTOP) mid all-reduce neither closes its connections nor reports: the
// others time out and name it as not responding.
TEST(GlooTest, HungRankIsNamedAfterTheTimeout) {
  const Group g(StoreKind::kFile, 3, 2000ms);
  const auto results = run_ranks(g.all_ranks(),
                                 [&](int rank) {
                                   auto c = g.connect(rank);
                                   Tensor big = contribution(rank, 1 << 18);
                                   for (int i = 0; i < 100000; ++i) {
                                     auto w = c->allreduce(big);
                                     if (rank == 1 && i == 2) ::raise(SIGSTOP);
                                     try {
                                       w->wait();
                                     } catch (const CommError& e) {
                                       return std::string(e.what());
                                     }
                                   }
                                   return std::string("no failure");
                                 },
                                 /*stragglers=*/{1});
  for (int r : {0, 2}) {
    const std::string& report = results[static_cast<std::size_t>(r)].report;
    EXPECT_TRUE(contains(report, "rank 1 (pid") && contains(report, "not responding")) << report;
  }
}

TEST(GlooTest, RankThatNeverArrivesIsNamed) {
  const Group g(StoreKind::kFile, 3, 1500ms);
  const auto t0 = Clock::now();
  const auto results = run_ranks({0, 1}, [&](int rank) {
    try {
      g.connect(rank);
      return std::string("connected without rank 2");
    } catch (const CommError& e) {
      return std::string(e.what());
    }
  });
  for (const auto& r : results) {
    EXPECT_TRUE(contains(r.report, "rank(s) 2 did not arrive within 1.5 s")) << r.report;
    EXPECT_TRUE(contains(r.report, g.rendezvous)) << r.report;
  }
  EXPECT_LT(Clock::now() - t0, 4s);
}

TEST(GlooTest, StoreHostThatNeverArrivesIsNamed) {
  const Group g(StoreKind::kTcp, 3, 1500ms);
  const auto results = run_ranks({1, 2}, [&](int rank) {
    try {
      g.connect(rank);
      return std::string("connected without rank 0");
    } catch (const CommError& e) {
      return std::string(e.what());
    }
  });
  for (const auto& r : results) {
    EXPECT_TRUE(contains(r.report, "rank 0, which hosts the store, did not arrive within 1.5 s"))
        << r.report;
    EXPECT_TRUE(contains(r.report, "no store answered")) << r.report;
  }
}

// ---- options ---------------------------------------------------------------------------------

TEST(GlooTest, RejectsBadOptions) {
  GlooOptions o;
  o.world_size = 2;
  o.rank = 2;
  o.rendezvous = "/tmp/unused";
  EXPECT_THROW(make_gloo_communicator(o), std::invalid_argument);
  o.rank = 0;
  o.rendezvous = "";
  EXPECT_THROW(make_gloo_communicator(o), std::invalid_argument);
  o.rendezvous = "127.0.0.1:0";
  o.rank = 1;
  EXPECT_THROW(make_gloo_communicator(o), std::invalid_argument);  // port 0 needs a group of one
}

TEST(GlooTest, GroupOfOneNeedsNoPeers) {
  TempDir dir;
  GlooOptions o;
  o.rendezvous = "127.0.0.1:0";
  auto c = make_gloo_communicator(o);
  Tensor t = contribution(0, 5), out = Tensor::empty({5});
  c->allreduce(t, ReduceOp::kAverage)->wait();
  c->allgather(t, out)->wait();
  c->barrier()->wait();
  EXPECT_EQ(mismatch(out, [](std::int64_t i) { return static_cast<float>(1 + i); }), "");
  o.rendezvous = dir.path();
  EXPECT_EQ(make_gloo_communicator(o)->size(), 1);
}

class EnvGuard {
 public:
  EnvGuard() {
    for (const char* n : kNames) unsetenv(n);
  }
  ~EnvGuard() {
    for (const char* n : kNames) unsetenv(n);
  }
  static constexpr const char* kNames[] = {
      "HPM_RANK",    "HPM_WORLD_SIZE",       "HPM_RENDEZVOUS",      "HPM_HOSTNAME",
      "HPM_TIMEOUT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"};
};

TEST(GlooTest, OptionsFromEnvironment) {
  EnvGuard guard;
  EXPECT_FALSE(gloo_options_from_env().has_value());
  setenv("HPM_RANK", "1", 1);
  setenv("HPM_WORLD_SIZE", "4", 1);
  EXPECT_THROW(gloo_options_from_env(), std::invalid_argument);  // no rendezvous
  setenv("HPM_RENDEZVOUS", "10.0.0.1:29500", 1);
  setenv("HPM_HOSTNAME", "10.0.0.2", 1);
  auto o = gloo_options_from_env();
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->rendezvous, "10.0.0.1:29500");
  EXPECT_EQ(o->hostname, "10.0.0.2");
  EXPECT_EQ(o->timeout, GlooOptions().timeout);
  setenv("HPM_TIMEOUT", "2.5", 1);
  EXPECT_EQ(gloo_options_from_env()->timeout, 2500ms);
  setenv("HPM_TIMEOUT", "0", 1);
  EXPECT_THROW(gloo_options_from_env(), std::invalid_argument);
  unsetenv("HPM_TIMEOUT");
  setenv("HPM_RANK", "x", 1);
  EXPECT_THROW(gloo_options_from_env(), std::invalid_argument);
  setenv("HPM_RANK", "4", 1);
  EXPECT_THROW(gloo_options_from_env(), std::invalid_argument);
  unsetenv("HPM_RANK");
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  o = gloo_options_from_env();
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->world_size, 3);
}

}  // namespace
}  // namespace hpm::comm
