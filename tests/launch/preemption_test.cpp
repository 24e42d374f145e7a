// The preemption handlers (SIGTERM, SIGINT) against what they interrupt: oneDNN's JIT GEMM
// kernels (libdnnl 2.x, uxlfoundation/oneDNN#4845) point the stack pointer into a heap workspace
// while they run, so a handler run on the interrupted stack writes its signal frame into the heap
// and a later free() aborts ("corrupted size vs. prev_size while consolidating": hpm train on one
// device, SIGTERMed, about one run in ten). The handlers run on a stack of their own.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "hpm/launch/worker.h"
#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/kernels.h"

namespace hpm::launch {
namespace {

TEST(Preemption, HandlersRunOnAStackOfTheirOwn) {
  ASSERT_NE(install_preemption_handlers(), nullptr);
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction sa {};
    ASSERT_EQ(::sigaction(sig, nullptr, &sa), 0);
    EXPECT_NE(sa.sa_flags & SA_ONSTACK, 0) << "signal " << sig;
  }
  stack_t stack{};
  ASSERT_EQ(::sigaltstack(nullptr, &stack), 0);
  EXPECT_EQ(stack.ss_flags & SS_DISABLE, 0) << "no alternate stack on the installing thread";
  EXPECT_GE(stack.ss_size, 64u * 1024) << "room for a frame with AVX-512 (and AMX) state";
}

// SIGTERMs delivered to a thread in the middle of matrix products (the mlp's first layer, as the
// Trainer runs it on one device): the heap stays intact. On the handlers' old, ordinary stack an
// AVX2 or AVX-512 machine aborted within a few dozen of them. After each one the handlers are
// installed again (the first signal resets them, as a second would kill).
TEST(Preemption, SignalsDuringMatrixProductsLeaveTheHeapIntact) {
  constexpr int kSignals = 500;
  std::vector<float> x(64 * 784, 0.5f), w(32 * 784, 0.25f), y(64 * 32);
  const pthread_t trainer = pthread_self();
  std::atomic<int> sent{0}, handled{0};
  install_preemption_handlers();
  std::thread sender([&] {
    std::mt19937 rng(1);
    for (int k = 0; k < kSignals; ++k) {
      while (handled.load() < k) std::this_thread::yield();
      ::usleep(static_cast<useconds_t>(rng() % 200));
      ::pthread_kill(trainer, SIGTERM);
      sent.store(k + 1);
    }
  });
  int seen = 0;
  while (seen < kSignals) {
    cpu::gemm(false, true, 64, 32, 784, 1.0f, x.data(), 784, w.data(), 784, 0.0f, y.data(), 32);
    if (sent.load() > seen) {
      ::sched_yield();  // a system call: the signal is handled on its return, at the latest
      install_preemption_handlers();
      handled.store(++seen);
    }
  }
  sender.join();
  EXPECT_FLOAT_EQ(y[0], 784 * 0.5f * 0.25f);
}

}  // namespace
}  // namespace hpm::launch
