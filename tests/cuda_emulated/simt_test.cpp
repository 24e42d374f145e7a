// simt.h's emulation itself: barriers and warp exchanges order a block's fibers as a card orders
// its threads; a barrier that can never complete stops the test instead of hanging it; and the
// sanitizers still see through the fibers (TSan a shared-memory race with no barrier between its
// accesses, ASan an access past the block's shared memory), which is what the emulated kernels'
// tests rely on under CI's sanitizer builds.
#include "cuda_emulated/simt.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace hpm {
namespace {

TEST(SimtEmulation, BarriersAndShufflesSeeEveryThreadsWrites) {
  constexpr unsigned kThreads = 96;  // three warps
  std::vector<float> out(2 * 2 * kThreads, -1.0f);
  simt::launch(2, kThreads, kThreads * sizeof(float), [&] {
    float* s = reinterpret_cast<float*>(simt::shared_memory());
    const unsigned t = threadIdx.x, lane = t % 32;
    s[t] = static_cast<float>(blockIdx.x * 1000 + t);
    __syncthreads();
    const float neighbour = s[(t + 1) % kThreads];  // written by another warp for t = 95
    __syncthreads();
    s[t] = 0;  // a write after everyone's read: the barrier above orders it
    float sum = static_cast<float>(lane);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(~0u, sum, offset);
    out[2 * (blockIdx.x * kThreads + t)] = neighbour;
    out[2 * (blockIdx.x * kThreads + t) + 1] = sum;
  });
  for (unsigned b = 0; b < 2; ++b) {
    for (unsigned t = 0; t < kThreads; ++t) {
      const std::size_t i = 2 * (b * kThreads + t);
      EXPECT_EQ(out[i], static_cast<float>(b * 1000 + (t + 1) % kThreads)) << b << " " << t;
      EXPECT_EQ(out[i + 1], 496.0f)
          << "the lanes' sum 0 + ... + 31, block " << b << " thread " << t;
    }
  }
}

// A finished thread leaves the barriers: the rest still pass them.
TEST(SimtEmulation, ThreadsThatReturnEarlyDoNotHoldTheOthers) {
  std::vector<int> passed(64, 0);
  simt::launch(1, 64, 0, [&] {
    if (threadIdx.x % 3 == 0) return;
    __syncthreads();
    __syncwarp();
    __syncthreads();
    passed[threadIdx.x] = 1;
  });
  for (unsigned t = 0; t < 64; ++t) EXPECT_EQ(passed[t], t % 3 == 0 ? 0 : 1) << t;
}

// Half a warp at __syncwarp, the other half at __syncthreads: on a card, a hang.
TEST(SimtEmulationDeathTest, ABarrierThatCanNeverCompleteStopsTheTest) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(simt::launch(1, 32, 0,
                            [] {
                              if (threadIdx.x < 16) {
                                __syncwarp();
                              } else {
                                __syncthreads();
                              }
                            }),
               "simt: every running thread of the block waits at a barrier that can never "
               "complete");
}

// Each thread writes its own word of shared memory and reads its neighbour's with no barrier
// between: a race on a card, which TSan must report although one OS thread runs every fiber.
// (The abort makes the test independent of TSAN_OPTIONS' halt_on_error: the report is printed
// when the race is seen.)
TEST(SimtEmulationDeathTest, UnderTSanASharedMemoryRaceIsReported) {
#if !defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "races are ThreadSanitizer's to see (CI runs this test in build-tsan)";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::vector<float> sink(64);
        simt::launch(1, 64, 64 * sizeof(float), [&] {
          float* s = reinterpret_cast<float*>(simt::shared_memory());
          s[threadIdx.x] = 1.0f;
          sink[threadIdx.x] = s[(threadIdx.x + 1) % 64];
        });
        std::abort();
      },
      "ThreadSanitizer: data race");
#endif
}

TEST(SimtEmulationDeathTest, UnderASanAnAccessPastSharedMemoryIsReported) {
#if !defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "out-of-bounds accesses are AddressSanitizer's to see (CI runs this test in "
                  "build-asan)";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::vector<float> sink(32);
        simt::launch(1, 32, 32 * sizeof(float), [&] {
          float* s = reinterpret_cast<float*>(simt::shared_memory());
          sink[threadIdx.x] = s[threadIdx.x + 1];  // thread 31 reads past the end
        });
        std::abort();
      },
      "heap-buffer-overflow");
#endif
}

}  // namespace
}  // namespace hpm
