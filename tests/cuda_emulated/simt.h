// A CPU stand-in for the parts of CUDA's execution model that hpm's register-tiled kernels use, so
// that their index arithmetic, masks and synchronization run in every build, GPU or not: each
// thread of a block is a fiber (its own stack, switched with swapcontext on the caller's thread),
// blocks run one after another, __syncthreads is a barrier of the block's fibers, warp shuffles
// and mma.sync a barrier of the warp's 32 with an exchange of registers. mma.sync m16n8k16 (bf16
// in, f32 out) follows the fragment layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16
// with floating point type"), written out independently of the kernels' own use of them. Shared
// memory is a heap buffer of the launch's exact size, so ASan sees an access past it; TSan sees
// two threads touching it without a barrier between (each fiber is a thread to TSan, and only the
// barriers order them: switching fibers synchronizes nothing). A barrier that can never complete
// (a __syncthreads some threads skip) stops the test, naming it, where the card would hang.
//
// Fibers rather than a std::thread per CUDA thread: a barrier of 128 OS threads on two cores is
// a round of futex waits and wake-ups, a round of fibers one of context switches on one thread
// (the whole emulated suite under ASan, same machine: 336 s of tests with threads, 62 with
// fibers; BENCHMARKS.md, issue 32's eighteenth session).
//
// Include the CUDA headers the kernels use first, then this, then the kernels with
// HPM_SIMT_EMULATION defined. Dynamic shared memory is shared_memory(), reached through a helper
// (attention_mma_kernels.cuh's dynamic_smem): `extern __shared__` has no emulation. Not a simulator
// of timing, occupancy or memory ordering beyond the barriers: a kernel that passes here can still
// be slow or racy on a card (racecheck's job).
#pragma once
#include <sys/mman.h>
#include <ucontext.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace hpm::simt {

// Whether this build runs under AddressSanitizer or ThreadSanitizer (GCC's macros). The emulated
// tests then run fewer shapes: a sanitizer looks for bad accesses and missing barriers, which each
// of a kernel's paths (partial tiles, the mask, refilled buffers) shows in one shape, while every
// emulated barrier costs it several times what it costs the Release build (TSan: about five
// times, its fiber switches and shadow updates), which runs every shape against the CPU. (CI runs
// the emulated tests in all three builds.)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif

struct Index {
  unsigned x = 0, y = 0, z = 0;
};

// A kernel's contract broken in a way the card would not report (a misaligned or out-of-bounds
// shared-memory access, copies left pending, a barrier some threads never reach): the test stops
// here, saying which.
[[noreturn]] inline void contract_broken(const char* what) {
  std::fprintf(stderr, "simt: %s\n", what);
  std::abort();
}

// TSan's view of the barriers: `release` before an arrival, `acquire` after the departure.
inline void release(const void* sync) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(const_cast<void*>(sync));
#else
  (void)sync;
#endif
}
inline void acquire(const void* sync) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(const_cast<void*>(sync));
#else
  (void)sync;
#endif
}

void yield(bool stalled);  // below: back to the scheduler

// A barrier of a block's fibers (all of them, or a warp's). Its counters are atomics only so that
// TSan, which sees each fiber as a thread, does not count them as races; one OS thread runs every
// fiber. What orders the fibers' memory is release/acquire on a sync object of the generation's
// parity: a fiber that leaves first and reaches the next barrier releases into the other one, so
// nothing it does after this barrier reaches a fiber still leaving it (the next generation cannot
// complete before every fiber has left this one).
class Barrier {
 public:
  explicit Barrier(unsigned count) : count_(count) {}
  Barrier(const Barrier&) = delete;
  Barrier& operator=(const Barrier&) = delete;

  void arrive_and_wait() {
    const std::uint64_t g = generation_.load(std::memory_order_relaxed);
    release(&sync_[g % 2]);
    if (arrive()) {
      yield(false);
      while (generation_.load(std::memory_order_relaxed) == g) yield(true);
    }
    acquire(&sync_[g % 2]);
  }
  // A finished thread leaves every barrier (an exited thread no longer counts on a card either).
  void arrive_and_drop() {
    release(&sync_[generation_.load(std::memory_order_relaxed) % 2]);
    count_.fetch_sub(1, std::memory_order_relaxed);
    const unsigned arrived = arrived_.load(std::memory_order_relaxed);
    if (arrived > 0 && arrived == count_.load(std::memory_order_relaxed)) complete();
  }

 private:
  // Counts an arrival; false when it completes the barrier (the last arrival does not wait).
  bool arrive() {
    const unsigned arrived = arrived_.load(std::memory_order_relaxed) + 1;
    if (arrived == count_.load(std::memory_order_relaxed)) {
      complete();
      return false;
    }
    arrived_.store(arrived, std::memory_order_relaxed);
    return true;
  }
  void complete() {
    arrived_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_relaxed);
  }

  std::atomic<unsigned> count_, arrived_{0};
  std::atomic<std::uint64_t> generation_{0};
  char sync_[2] = {};
};

class Block {
 public:
  Block(unsigned threads, std::size_t shared_bytes)
      // Shared memory starts as garbage, as on a card: 0xFF bytes, a NaN as bf16 or f32, so that
      // a read of what no thread wrote shows.
      : all_(threads), shared_(shared_bytes, 0xFF), lanes_(threads) {
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) {
      const unsigned in_warp = threads - 32 * w < 32 ? threads - 32 * w : 32;
      warps_.push_back(std::make_unique<Barrier>(in_warp));
    }
  }

  // What a lane shows its warp for an exchange.
  struct Lane {
    std::uint32_t a[4];
    std::uint32_t b[2];
    unsigned char value[8];  // a shuffled float, double or 64-bit integer
  };

  void sync_threads() { all_.arrive_and_wait(); }
  void sync_warp(unsigned thread) { warps_[thread / 32]->arrive_and_wait(); }
  void leave(unsigned thread) {
    all_.arrive_and_drop();
    warps_[thread / 32]->arrive_and_drop();
  }
  unsigned char* shared() { return shared_.data(); }
  // Whether [p, p + bytes) lies in the block's shared memory.
  bool in_shared(const void* p, std::size_t bytes) const {
    const auto* b = static_cast<const unsigned char*>(p);
    return b >= shared_.data() && b + bytes <= shared_.data() + shared_.size();
  }
  Lane& lane(unsigned thread) { return lanes_[thread]; }

 private:
  Barrier all_;
  std::vector<std::unique_ptr<Barrier>> warps_;
  std::vector<unsigned char> shared_;
  std::vector<Lane> lanes_;
};

// cp.async: a thread's copies wait in its uncommitted group until commit_group closes it, and land
// only when cp.async.wait_group lets their group complete (all but the `pending` newest), so that
// a read before the wait sees the old contents, and a missing wait or barrier fails (or races,
// under TSan) as it would on a card.
struct AsyncCopy {
  void* dst;
  const void* src;
  bool valid;
};

// A CUDA thread: its index, saved registers and stack, and its cp.async groups.
struct Fiber {
  Index thread;
  ucontext_t context{};
  void* stack = nullptr;
  std::size_t stack_bytes = 0;
  std::vector<AsyncCopy> uncommitted_copies;
  std::deque<std::vector<AsyncCopy>> committed_copies;
  // Read by the scheduler after the fiber yields (atomics for TSan, as Barrier's counters).
  std::atomic<bool> finished{false}, stalled{false};
  void* tsan_fiber = nullptr;
  void* asan_fake_stack = nullptr;
};

// One launch's fibers and the block they run. A fiber finds it through `running_launch`.
struct Launch {
  Block* block = nullptr;
  void (*body)(void*) = nullptr;  // runs the kernel object at `kernel`
  void* kernel = nullptr;
  std::deque<Fiber> fibers;
  std::atomic<Fiber*> running{nullptr};
  ucontext_t scheduler{};
  void* scheduler_tsan_fiber = nullptr;
  // The scheduler's stack, for ASan's view of a switch back to it.
  std::atomic<const void*> scheduler_stack{nullptr};
  std::atomic<std::size_t> scheduler_stack_bytes{0};
  char started = 0;  // TSan: the scheduler's set-up of a block happens before its fibers run
};

inline std::atomic<Launch*> running_launch{nullptr};
inline Index block_index, block_dim, grid_dim;  // written between blocks, read by the fibers

inline Launch& launch_now() { return *running_launch.load(std::memory_order_relaxed); }
inline Fiber& fiber_now() { return *launch_now().running.load(std::memory_order_relaxed); }
inline Block& block_now() { return *launch_now().block; }

// From a fiber to the scheduler: `stalled` says it came back without progress (still waiting at
// a barrier); `for_good`, that it has finished. Out of line, as resume() and prepare() below: a
// caller of swapcontext or getcontext (which return twice) keeps nothing in registers across it.
[[gnu::noinline]] inline void switch_to_scheduler(Launch& l, Fiber& f, bool stalled,
                                                  bool for_good) {
  f.stalled.store(stalled, std::memory_order_relaxed);
  if (for_good) f.finished.store(true, std::memory_order_relaxed);
#if defined(__SANITIZE_THREAD__)
  // The last switch synchronizes, as a join: everything the fiber did, to its last read of `l`,
  // happens before what the scheduler does next (the next block, the caller's checks).
  __tsan_switch_to_fiber(l.scheduler_tsan_fiber, for_good ? 0 : __tsan_switch_to_fiber_no_sync);
#endif
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(for_good ? nullptr : &f.asan_fake_stack,
                                 l.scheduler_stack.load(std::memory_order_relaxed),
                                 l.scheduler_stack_bytes.load(std::memory_order_relaxed));
#endif
  swapcontext(&f.context, &l.scheduler);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(f.asan_fake_stack, nullptr, nullptr);
#endif
}

inline void yield(bool stalled) { switch_to_scheduler(launch_now(), fiber_now(), stalled, false); }

inline void sync_threads() { block_now().sync_threads(); }
inline void sync_warp() { block_now().sync_warp(fiber_now().thread.x); }
inline unsigned char* shared_memory() { return block_now().shared(); }

// Every lane gets the value lane `source(lane)` of its warp passed.
template <typename T, typename Source>
T shuffle(T v, Source source) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes here");
  const unsigned me = fiber_now().thread.x, lane = me & 31u;
  std::memcpy(block_now().lane(me).value, &v, sizeof v);
  block_now().sync_warp(me);
  T other;
  std::memcpy(&other, block_now().lane(me - lane + source(lane)).value, sizeof other);
  block_now().sync_warp(me);  // nobody overwrites a value before every lane has read it
  return other;
}
template <typename T>
T shfl_xor(T v, int lane_mask) {
  return shuffle(v, [lane_mask](unsigned lane) { return lane ^ static_cast<unsigned>(lane_mask); });
}
template <typename T>
T shfl_down(T v, int delta) {  // a lane past the warp's end keeps its own value, as on a card
  return shuffle(v, [delta](unsigned lane) {
    const unsigned from = lane + static_cast<unsigned>(delta);
    return from < 32u ? from : lane;
  });
}

template <typename To, typename From>
To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

inline void check_shared_16(const void* p, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) contract_broken(what);
  if (!block_now().in_shared(p, 16)) contract_broken(what);
}

inline void cp_async(void* dst, const void* src, bool valid) {
  check_shared_16(dst, "cp.async to a misaligned or out-of-bounds shared address");
  fiber_now().uncommitted_copies.push_back({dst, src, valid});
}
inline void cp_async_commit() {
  Fiber& f = fiber_now();
  f.committed_copies.push_back(std::move(f.uncommitted_copies));
  f.uncommitted_copies.clear();
}
inline void cp_async_wait(int pending) {
  auto& committed_copies = fiber_now().committed_copies;
  while (static_cast<int>(committed_copies.size()) > pending) {
    for (const AsyncCopy& c : committed_copies.front()) {
      if (c.valid) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);  // src-size 0: zeros
      }
    }
    committed_copies.pop_front();
  }
}

// Atomics serialize on one lock.
inline std::mutex& atomic_lock() {
  static std::mutex lock;
  return lock;
}
template <typename T>
T atomic_min(T* address, T value) {
  const std::lock_guard<std::mutex> hold(atomic_lock());
  const T old = *address;
  if (value < old) *address = value;
  return old;
}

template <typename T>
T atomic_add(T* address, T value) {
  const std::lock_guard<std::mutex> hold(atomic_lock());
  const T old = *address;
  *address = old + value;
  return old;
}

inline float bf16_at(std::uint32_t pair, int half) {
  const std::uint32_t bits = (pair >> (16 * half)) & 0xffffu;
  float f;
  const std::uint32_t widened = bits << 16;
  std::memcpy(&f, &widened, sizeof f);
  return f;
}

// d += A B, A 16 x 16 and B 16 x 8 spread over the warp's lanes as the PTX ISA lays them out.
inline void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                              const std::uint32_t (&b)[2]) {
  const unsigned me = fiber_now().thread.x, lane = me & 31u, first = me - lane;
  Block::Lane& mine = block_now().lane(me);
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  block_now().sync_warp(me);
  // A's (row, k): lane 4 (row % 8) + (k % 8) / 2, register (row >= 8) + 2 (k >= 8), half k % 2.
  auto a_at = [&](int row, int k) {
    const Block::Lane& owner = block_now().lane(first + 4 * (row % 8) + (k % 8) / 2);
    return bf16_at(owner.a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  // B's (k, col): lane 4 col + (k % 8) / 2, register k >= 8, half k % 2.
  auto b_at = [&](int k, int col) {
    const Block::Lane& owner = block_now().lane(first + 4 * col + (k % 8) / 2);
    return bf16_at(owner.b[k >= 8 ? 1 : 0], k % 2);
  };
  const int g = static_cast<int>(lane / 4), q = static_cast<int>(lane % 4);
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * q + e % 2;
    float sum = d[e];
    for (int k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, col);
    out[e] = sum;
  }
  block_now().sync_warp(me);  // every lane has read the others' registers
  std::memcpy(d, out, sizeof out);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the address of row l % 8 of
// matrix l / 8 (8 consecutive 16-bit elements); register m of lane l receives matrix m's
// (row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1), or with trans its (rows 2 (l % 4) and
// 2 (l % 4) + 1, column l / 4), the first in the low half.
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row, bool trans) {
  check_shared_16(row, "ldmatrix row address misaligned or out of shared memory");
  const unsigned me = fiber_now().thread.x, lane = me & 31u, first = me - lane;
  const void* mine = row;
  std::memcpy(block_now().lane(me).value, &mine, sizeof mine);
  block_now().sync_warp(me);
  auto element = [&](unsigned matrix, unsigned row_in, unsigned col) {
    const void* base;
    std::memcpy(&base, block_now().lane(first + 8 * matrix + row_in).value, sizeof base);
    std::uint16_t v;
    std::memcpy(&v, static_cast<const unsigned char*>(base) + 2 * col, sizeof v);
    return std::uint32_t{v};
  };
  std::uint32_t out[4];
  for (unsigned m = 0; m < 4; ++m) {
    const unsigned a = lane / 4, b = 2 * (lane % 4);
    out[m] = trans ? element(m, b, a) | element(m, b + 1, a) << 16
                   : element(m, a, b) | element(m, a, b + 1) << 16;
  }
  block_now().sync_warp(me);  // every lane has read the others' addresses
  std::memcpy(r, out, sizeof out);
}

// Each fiber's stack: one mapping for the launch, committed as it is touched, with a page below
// each stack that faults rather than letting an overflow run into the next.
class Stacks {
 public:
  static constexpr std::size_t kBytes = std::size_t{1} << 20, kGuard = 4096;
  explicit Stacks(unsigned count) : bytes_(count * (kBytes + kGuard)) {
    base_ = static_cast<unsigned char*>(mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (base_ == MAP_FAILED) contract_broken("no room for the fibers' stacks");
    for (unsigned i = 0; i < count; ++i) {
      if (mprotect(base_ + i * (kBytes + kGuard), kGuard, PROT_NONE) != 0) {
        contract_broken("cannot protect the pages between the fibers' stacks");
      }
    }
  }
  ~Stacks() { munmap(base_, bytes_); }
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;
  void* stack(unsigned i) const { return base_ + i * (kBytes + kGuard) + kGuard; }

 private:
  std::size_t bytes_;
  unsigned char* base_;
};

// A new fiber's first switch in: ASan learns that it arrived, and from which stack (the
// scheduler's, for the switches back).
[[gnu::noinline]] inline void entered(Launch& l) {
#if defined(__SANITIZE_ADDRESS__)
  const void* from = nullptr;
  std::size_t from_bytes = 0;
  __sanitizer_finish_switch_fiber(nullptr, &from, &from_bytes);
  l.scheduler_stack.store(from, std::memory_order_relaxed);
  l.scheduler_stack_bytes.store(from_bytes, std::memory_order_relaxed);
#else
  (void)l;
#endif
}

// A fiber's first frame. It never returns (the last switch leaves it), so it takes no local's
// address: ASan would leave that frame's poisoned guards on the stack the next block's fiber
// reuses (the frames it calls return, and clear theirs).
inline void fiber_main() {
  Launch& l = launch_now();
  Fiber& f = fiber_now();
  entered(l);
  acquire(&l.started);
  l.body(l.kernel);
  if (!f.uncommitted_copies.empty() || !f.committed_copies.empty()) {
    contract_broken("a thread ended with cp.async copies pending");
  }
  l.block->leave(f.thread.x);
  switch_to_scheduler(l, f, false, true);
}

// Sets a fiber to start fiber_main() as thread `tx` on its stack.
[[gnu::noinline]] inline void prepare(Fiber& f, unsigned tx) {
  f.thread = Index{tx, 0, 0};
  f.finished.store(false, std::memory_order_relaxed);
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack;
  f.context.uc_stack.ss_size = f.stack_bytes;
  f.context.uc_link = nullptr;
  makecontext(&f.context, fiber_main, 0);
  // ASan's swapcontext clears the shadow of a context's stack at every switch to it when the
  // context names one: the stack is in the saved registers now, and the annotations tell ASan of
  // each switch.
  f.context.uc_stack = stack_t{};
}

[[gnu::noinline]] inline void resume(Launch& l, Fiber& f) {
  l.running.store(&f, std::memory_order_relaxed);
#if defined(__SANITIZE_THREAD__)
  __tsan_switch_to_fiber(f.tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(__SANITIZE_ADDRESS__)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, f.stack, f.stack_bytes);
#endif
  swapcontext(&l.scheduler, &f.context);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// Runs kernel() on a grid of grid_x x grid_y blocks of `threads` threads with `shared_bytes` of
// dynamic shared memory, a block at a time, its threads as fibers taking turns: each runs until
// it waits at a barrier or ends. Not reentrant: one launch at a time in the process.
template <typename Kernel>
void launch(unsigned grid_x, unsigned grid_y, unsigned threads, std::size_t shared_bytes,
            Kernel&& kernel) {
  Launch l;
  l.kernel = const_cast<void*>(static_cast<const void*>(&kernel));
  l.body = [](void* k) { (*static_cast<std::remove_reference_t<Kernel>*>(k))(); };
  Stacks stacks(threads);
  for (unsigned tx = 0; tx < threads; ++tx) {
    Fiber& f = l.fibers.emplace_back();
    f.stack = stacks.stack(tx);
    f.stack_bytes = Stacks::kBytes;
#if defined(__SANITIZE_THREAD__)
    f.tsan_fiber = __tsan_create_fiber(0);
#endif
  }
#if defined(__SANITIZE_THREAD__)
  l.scheduler_tsan_fiber = __tsan_get_current_fiber();
#endif
  if (running_launch.exchange(&l) != nullptr) contract_broken("a launch inside a launch");
  for (unsigned by = 0; by < grid_y; ++by) {
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      Block block(threads, shared_bytes);
      l.block = &block;
      block_index = Index{bx, by, 0};
      block_dim = Index{threads, 1, 1};
      grid_dim = Index{grid_x, grid_y, 1};
      for (unsigned tx = 0; tx < threads; ++tx) prepare(l.fibers[tx], tx);
      release(&l.started);
      for (;;) {
        unsigned running = 0, progressed = 0;
        for (Fiber& f : l.fibers) {
          if (f.finished.load(std::memory_order_relaxed)) continue;
          resume(l, f);
          running += f.finished.load(std::memory_order_relaxed) ? 0 : 1;
          progressed += f.stalled.load(std::memory_order_relaxed) ? 0 : 1;
        }
        if (running == 0) break;
        if (progressed == 0) {
          contract_broken(
              "every running thread of the block waits at a barrier that can never "
              "complete (a __syncthreads or warp exchange some threads skip)");
        }
      }
    }
  }
  running_launch.store(nullptr);
#if defined(__SANITIZE_THREAD__)
  for (Fiber& f : l.fibers) __tsan_destroy_fiber(f.tsan_fiber);
#endif
}

// A one-dimensional grid.
template <typename Kernel>
void launch(unsigned grid, unsigned threads, std::size_t shared_bytes, Kernel&& kernel) {
  launch(grid, 1, threads, shared_bytes, std::forward<Kernel>(kernel));
}

}  // namespace hpm::simt

#define threadIdx (::hpm::simt::fiber_now().thread)
#define blockIdx (::hpm::simt::block_index)
#define blockDim (::hpm::simt::block_dim)
#define gridDim (::hpm::simt::grid_dim)
#define __syncthreads() ::hpm::simt::sync_threads()
#define __syncwarp(...) ::hpm::simt::sync_warp()
#define __shfl_xor_sync(mask, v, lane_mask) ::hpm::simt::shfl_xor((v), (lane_mask))
#define __shfl_down_sync(mask, v, delta) ::hpm::simt::shfl_down((v), (delta))
#define __float_as_uint(x) ::hpm::simt::bit_cast<unsigned>(static_cast<float>(x))
#define __uint_as_float(x) ::hpm::simt::bit_cast<float>(static_cast<unsigned>(x))
#define __int_as_float(x) ::hpm::simt::bit_cast<float>(static_cast<int>(x))
#define __fadd_rn(a, b) ((a) + (b))  // compiled without contraction (-ffp-contract=off)
#define __fmul_rn(a, b) ((a) * (b))
#define __fsub_rn(a, b) ((a) - (b))
#define __fdiv_rn(a, b) ((a) / (b))
#define atomicMin(address, value) ::hpm::simt::atomic_min((address), (value))
#define atomicAdd(address, value) ::hpm::simt::atomic_add((address), (value))
#define __expf(x) std::exp(x)
#define __logf(x) std::log(x)
#define __launch_bounds__(...)
// A block's static shared arrays: one in the process serves, blocks running one at a time.
#undef __shared__
#define __shared__ static
