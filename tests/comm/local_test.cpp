// The local backend against closed forms: every collective, every all-reduce algorithm, group
// sizes 1-5 (powers of two and not), message sizes around the ring's sub-chunk; bitwise agreement
// across ranks and runs; and every documented failure (timeout, a rank that left, mismatched
// calls, a recv that never matches).
#include "hpm/comm/local.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "hpm/tensor/random.h"

namespace hpm::comm {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank) on one thread per rank and joins them.
template <typename Fn>
void on_ranks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

// Rank r holds r + 1 + i/1000 at element i: sums, averages and maxima have closed forms.
Tensor local_contribution(int rank, std::int64_t n) {
  Tensor t = Tensor::empty({n});
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < n; ++i)
    p[i] = static_cast<float>(rank + 1) + static_cast<float>(i % 1000) / 1000.0f;
  return t;
}

struct Case {
  int size;
  Algorithm algorithm;
  std::int64_t n;
};

class AllreduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(AllreduceTest, MatchesClosedFormAndAgreesBitwise) {
  const Case c = GetParam();
  auto comms = make_local_group(c.size, 10s);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
    std::vector<Tensor> results(c.size);
    on_ranks(c.size, [&](int r) {
      comms[r]->set_algorithm(c.algorithm);
      results[r] = local_contribution(r, c.n);
      comms[r]->allreduce(results[r], op)->wait();
    });
    const float n_ranks = static_cast<float>(c.size);
    for (std::int64_t i = 0; i < c.n; ++i) {
      const float frac = static_cast<float>(i % 1000) / 1000.0f;
      float expected = 0;
      if (op == ReduceOp::kMax)
        expected = n_ranks + frac;
      else
        expected = n_ranks * (n_ranks + 1) / 2 + n_ranks * frac;
      if (op == ReduceOp::kAverage) expected /= n_ranks;
      ASSERT_NEAR(results[0].data<float>()[i], expected, 1e-5f * std::abs(expected))
          << reduce_op_name(op) << " element " << i;
    }
    for (int r = 1; r < c.size; ++r) {
      ASSERT_EQ(
          0, std::memcmp(results[0].data<float>(), results[r].data<float>(), results[r].nbytes()))
          << "rank " << r << " differs from rank 0 (" << reduce_op_name(op) << ")";
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int size : {1, 2, 3, 4, 5}) {
    for (Algorithm a :
         {Algorithm::kDirect, Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kAuto}) {
      for (std::int64_t n : {1, 7, 1000, 200003}) out.push_back({size, a, n});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Local, AllreduceTest, ::testing::ValuesIn(cases()), [](const auto& info) {
  return "size" + std::to_string(info.param.size) + "_" + algorithm_name(info.param.algorithm) +
         "_n" + std::to_string(info.param.n);
});

// run_local_group runs every rank on its own thread and, when one fails, reports that rank's own
// error rather than the CommError its peers get for its leaving.
TEST(LocalGroupRun, RunsEveryRankAndRethrowsTheFailingRanksOwnError) {
  std::vector<float> sums(3, 0.0f);
  run_local_group(3, [&](CommunicatorPtr c) {
    Tensor t = Tensor::full({2}, static_cast<float>(c->rank() + 1));
    c->allreduce(t)->wait();
    sums[static_cast<std::size_t>(c->rank())] = t.to_vector()[0];
  });
  EXPECT_EQ(sums, (std::vector<float>{6, 6, 6}));
  try {
    run_local_group(
        3,
        [&](CommunicatorPtr c) {
          if (c->rank() == 1) throw std::runtime_error("rank 1 broke");
          Tensor t = Tensor::full({2}, 1.0f);
          c->allreduce(t)->wait();  // rank 1 never comes: fails once it leaves
        },
        std::chrono::seconds(10));
    FAIL() << "expected the rank's error";
  } catch (const CommError& e) {
    FAIL() << "a peer's CommError came first: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank 1 broke");
  }
}

TEST(LocalAllreduce, BitIdenticalFromRunToRun) {
  for (Algorithm a : {Algorithm::kDirect, Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      auto comms = make_local_group(3, 10s);
      std::vector<Tensor> data(3);
      on_ranks(3, [&](int r) {
        Generator gen(100 + static_cast<std::uint64_t>(r));
        data[r] = Tensor::randn({70001}, gen);
        comms[r]->set_algorithm(a);
        comms[r]->allreduce(data[r], ReduceOp::kAverage)->wait();
      });
      runs.push_back(data[1].to_vector());
    }
    EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)))
        << algorithm_name(a);
  }
}

TEST(LocalAllreduce, QueuedCollectivesRunInIssueOrder) {
  auto comms = make_local_group(2, 10s);
  std::vector<std::vector<Tensor>> data(2);
  on_ranks(2, [&](int r) {
    std::vector<WorkPtr> works;
    for (int k = 0; k < 20; ++k) {
      data[r].push_back(Tensor::full({100 + k}, static_cast<float>(k * (r + 1))));
      works.push_back(comms[r]->allreduce(data[r].back()));
    }
    for (auto& w : works) w->wait();
  });
  for (int k = 0; k < 20; ++k) EXPECT_FLOAT_EQ(data[0][k].data<float>()[99], 3.0f * k);
}

TEST(LocalCollectives, ReduceScatterAllgatherBroadcastBarrier) {
  for (int size : {1, 2, 3, 4}) {
    auto comms = make_local_group(size, 10s);
    const std::int64_t block = 1001;
    std::vector<Tensor> scattered(size), gathered(size), bcast(size);
    on_ranks(size, [&](int r) {
      Tensor in = local_contribution(r, block * size);
      scattered[r] = Tensor::empty({block});
      comms[r]->reduce_scatter(in, scattered[r], ReduceOp::kSum)->wait();
      gathered[r] = Tensor::empty({block * size});
      comms[r]->allgather(Tensor::full({block}, static_cast<float>(r)), gathered[r])->wait();
      bcast[r] = Tensor::full({33}, static_cast<float>(r + 10));
      comms[r]->broadcast(bcast[r], size - 1)->wait();
      comms[r]->barrier()->wait();
    });
    const float s = static_cast<float>(size);
    for (int r = 0; r < size; ++r) {
      for (std::int64_t i = 0; i < block; ++i) {
        const std::int64_t g = r * block + i;
        ASSERT_NEAR(scattered[r].data<float>()[i],
                    s * (s + 1) / 2 + s * static_cast<float>(g % 1000) / 1000.0f, 1e-4f);
      }
      for (int j = 0; j < size; ++j)
        ASSERT_EQ(gathered[r].data<float>()[j * block + 5], static_cast<float>(j));
      ASSERT_EQ(bcast[r].data<float>()[32], s - 1 + 10);
    }
  }
}

// Control data travels as what it is: bytes, integers; allgather, broadcast, send and recv move
// any dtype unchanged.
TEST(LocalCollectives, BytesAndIntegersMoveUnchanged) {
  auto comms = make_local_group(3, 10s);
  std::vector<std::string> gathered(3);
  std::vector<std::vector<std::int64_t>> broadcast(3);
  std::string received;
  on_ranks(3, [&](int r) {
    const std::string mine = "rank" + std::to_string(r) + "\xff";  // a byte above 127 too
    Tensor all = Tensor::empty({static_cast<std::int64_t>(mine.size()) * 3}, DType::U8);
    comms[r]->allgather(Tensor::from_bytes(mine), all)->wait();
    gathered[r] = all.to_bytes();
    const std::vector<std::int64_t> big{r == 1 ? (std::int64_t{1} << 53) + 1 : 0, -7};
    Tensor b = Tensor::from_i64(big, {2});
    comms[r]->broadcast(b, 1)->wait();
    broadcast[r] = b.to_vector_i64();
    if (r == 0) comms[0]->send(Tensor::from_bytes("hello"), 2, 3)->wait();
    if (r == 2) {
      Tensor got = Tensor::empty({5}, DType::U8);
      comms[2]->recv(got, 0, 3)->wait();
      received = got.to_bytes();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(gathered[r], std::string("rank0\xffrank1\xffrank2\xff"));
    // 2^53 + 1 is no float (nor double): integers are not squeezed through floats.
    EXPECT_EQ(broadcast[r], (std::vector<std::int64_t>{(std::int64_t{1} << 53) + 1, -7}));
  }
  EXPECT_EQ(received, "hello");
  EXPECT_THROW(comms[0]->allgather(Tensor::zeros({1}, DType::U8), Tensor::zeros({3})),
               std::invalid_argument);
}

TEST(LocalPointToPoint, TagsMatchInOrderWhicheverSideComesFirst) {
  auto comms = make_local_group(2, 5s);
  on_ranks(2, [&](int r) {
    if (r == 0) {
      comms[0]->send(Tensor::full({4}, 1.0f), 1, 7)->wait();
      comms[0]->send(Tensor::full({4}, 2.0f), 1, 8)->wait();
      comms[0]->send(Tensor::full({4}, 3.0f), 1, 7)->wait();
      Tensor back = Tensor::empty({2});
      comms[0]->recv(back, 1, 0)->wait();
      EXPECT_EQ(back.data<float>()[1], 42.0f);
    } else {
      Tensor a = Tensor::empty({4}), b = Tensor::empty({4}), c = Tensor::empty({4});
      auto wb = comms[1]->recv(b, 0, 8);
      auto wa = comms[1]->recv(a, 0, 7);
      auto wc = comms[1]->recv(c, 0, 7);
      wa->wait();
      wb->wait();
      wc->wait();
      EXPECT_EQ(a.data<float>()[0], 1.0f);
      EXPECT_EQ(b.data<float>()[0], 2.0f);
      EXPECT_EQ(c.data<float>()[0], 3.0f);
      comms[1]->send(Tensor::full({2}, 42.0f), 0, 0);
    }
  });
}

TEST(LocalPointToPoint, SizeMismatchAndMissingMessageAreErrors) {
  auto comms = make_local_group(2, 300ms);
  comms[0]->send(Tensor::full({4}, 1.0f), 1, 0);
  Tensor small = Tensor::empty({3});
  try {
    comms[1]->recv(small, 0, 0)->wait();
    FAIL() << "expected a size mismatch";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("expected 3 floats, the message has 4"), std::string::npos)
        << e.what();
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comms[1]->recv(small, 0, 5)->wait();
    FAIL() << "expected a timeout";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("recv of 3 floats from rank 0 tag 5"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

// A withdrawn recv fails at once and lets go of its buffer (whose Device may go next); the
// message of its tag reaches the next recv. Cancelling a completed Work changes nothing.
TEST(LocalPointToPoint, ACancelledRecvLetsGoOfItsBufferAndMissesTheMessage) {
  auto comms = make_local_group(2, 10s);
  Device stage("stage");
  WorkPtr pending;
  {
    DeviceGuard on_stage(stage);
    pending = comms[1]->recv(Tensor::empty({4}), 0, 3);
  }
  EXPECT_GE(stage.stats().current_bytes, 4 * sizeof(float));  // held by the group
  pending->cancel();
  EXPECT_TRUE(pending->completed()) << "a withdrawn recv waits for nothing";
  try {
    pending->wait();
    FAIL() << "a cancelled recv completed";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("recv of 4 floats from rank 0 tag 3: cancelled"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(stage.stats().current_bytes, 0u);
  comms[0]->send(Tensor::full({4}, 7.0f), 1, 3);
  Tensor got = Tensor::zeros({4});
  auto delivered = comms[1]->recv(got, 0, 3);
  delivered->wait();
  delivered->cancel();
  delivered->wait();
  EXPECT_EQ(got.to_vector(), std::vector<float>(4, 7.0f));
}

// wait_for() says "still running" with false and "failed" with the operation's own error. Polled
// in short slices while another thread finishes the Work, it never reports a success as a
// failure (catching wait()'s timeout and then asking completed() did, when the Work finished in
// between: a pipeline stage failed a receive that had arrived).
TEST(LocalWork, WaitForTellsRunningFromDoneFromFailed) {
  Work running("recv of 1 float");
  EXPECT_FALSE(running.wait_for(1ms));
  running.finish();
  EXPECT_TRUE(running.wait_for(0ms));
  Work failed("recv of 2 floats");
  failed.finish(std::make_exception_ptr(CommError("recv of 2 floats: peer left")));
  try {
    failed.wait_for(0ms);
    FAIL() << "a failed Work reported success";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "recv of 2 floats: peer left");
  }
  for (int i = 0; i < 200; ++i) {
    Work racing("recv " + std::to_string(i));
    std::thread finisher([&] { racing.finish(); });
    EXPECT_NO_THROW({
      while (!racing.wait_for(0ms)) {
      }
    }) << "Work "
       << i;
    finisher.join();
  }
}

TEST(LocalFailures, ARankThatNeverArrivesIsNamedWithinTheTimeout) {
  auto comms = make_local_group(3, 400ms);
  std::vector<std::string> errors(3);
  const auto t0 = std::chrono::steady_clock::now();
  on_ranks(2, [&](int r) {  // rank 2 never calls
    try {
      comms[r]->allreduce(Tensor::full({1 << 16}, 1.0f))->wait();
    } catch (const CommError& e) {
      errors[r] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("rank(s) 2 did not arrive within"), std::string::npos) << errors[r];
  }
  // The group stays failed: a later collective fails at once with the same reason.
  try {
    comms[2]->barrier()->wait();
    FAIL() << "expected the failed group to refuse";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 2 did not arrive"), std::string::npos)
        << e.what();
  }
}

TEST(LocalFailures, ARankThatLeavesIsNamed) {
  auto comms = make_local_group(2, 20s);
  Tensor data = Tensor::full({1000}, 1.0f);
  auto work = comms[0]->allreduce(data);
  std::this_thread::sleep_for(50ms);
  const auto t0 = std::chrono::steady_clock::now();
  comms[1].reset();  // rank 1's communicator is destroyed: the rank is gone
  try {
    work->wait();
    FAIL() << "expected an error";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 has left the group"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(LocalFailures, MismatchedCollectivesNameBothCalls) {
  auto comms = make_local_group(2, 5s);
  std::vector<std::string> errors(2);
  on_ranks(2, [&](int r) {
    try {
      if (r == 0)
        comms[0]->allreduce(Tensor::full({10}, 1.0f))->wait();
      else
        comms[1]->broadcast(Tensor::full({12}, 1.0f), 0)->wait();
    } catch (const CommError& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("mismatched collectives: rank 0 called allreduce of 10 floats (sum"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("rank 1 called broadcast of 12 floats from root 0"), std::string::npos) << e;
  }
}

TEST(LocalCollectives, BadArgumentsAreRejectedOnTheCallersThread) {
  auto comms = make_local_group(2, 1s);
  EXPECT_THROW(comms[0]->allreduce(Tensor()), std::invalid_argument);
  EXPECT_THROW(comms[0]->allreduce(Tensor::zeros({3}, DType::I64)), std::invalid_argument);
  EXPECT_THROW(comms[0]->broadcast(Tensor::zeros({3}), 2), std::invalid_argument);
  EXPECT_THROW(comms[0]->reduce_scatter(Tensor::zeros({5}), Tensor::zeros({2})),
               std::invalid_argument);
  EXPECT_THROW(comms[0]->send(Tensor::zeros({5}), -1, 0), std::invalid_argument);
  EXPECT_THROW(algorithm_from_name("butterfly"), std::invalid_argument);
  EXPECT_EQ(algorithm_from_name("ring"), Algorithm::kRing);
}

}  // namespace
}  // namespace hpm::comm
