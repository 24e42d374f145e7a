// A CPU stand-in for the parts of CUDA's execution model that hpm's register-tiled kernels use, so
// that their index arithmetic, masks and synchronization run in every build, GPU or not: each
// thread of a block is a std::thread, blocks run one after another, __syncthreads is a barrier of
// the block's threads, warp shuffles and mma.sync a barrier of the warp's 32 with an exchange of
// registers. mma.sync m16n8k16 (bf16 in, f32 out) follows the fragment layouts of the PTX ISA
// ("Matrix Fragments for mma.m16n8k16 with floating point type"), written out independently of
// the kernels' own use of them. Shared memory is a heap buffer of the launch's exact size, so
// ASan sees an access past it; TSan sees two threads touching it without a barrier between.
//
// Include the CUDA headers the kernels use first, then this, then the kernels with
// HPM_SIMT_EMULATION defined. Dynamic shared memory is shared_memory(), reached through a helper
// (attention_mma_kernels.cuh's dynamic_smem): `extern __shared__` has no emulation. Not a simulator
// of timing, occupancy or memory ordering beyond the barriers: a kernel that passes here can still
// be slow or racy on a card (racecheck's job).
#pragma once
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace hpm::simt {

// Whether this build runs under AddressSanitizer or ThreadSanitizer (GCC's macros). The emulated
// tests then run fewer shapes: a sanitizer looks for bad accesses and missing barriers, which each
// of a kernel's paths (partial tiles, the mask, refilled buffers) shows in one shape, while every
// emulated barrier costs it thousands of times what it costs the Release build, which runs every
// shape against the CPU. (CI runs the emulated tests in all three builds.)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif

struct Index {
  unsigned x = 0, y = 0, z = 0;
};

class Block {
 public:
  Block(unsigned threads, std::size_t shared_bytes)
      // Shared memory starts as garbage, as on a card: 0xFF bytes, a NaN as bf16 or f32, so that
      // a read of what no thread wrote shows.
      : all_(static_cast<std::ptrdiff_t>(threads)), shared_(shared_bytes, 0xFF), lanes_(threads) {
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) {
      const unsigned in_warp = threads - 32 * w < 32 ? threads - 32 * w : 32;
      warps_.push_back(std::make_unique<std::barrier<>>(static_cast<std::ptrdiff_t>(in_warp)));
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
  // A finished thread leaves every barrier (an exited thread no longer counts on a card either).
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
  std::barrier<> all_;
  std::vector<std::unique_ptr<std::barrier<>>> warps_;
  std::vector<unsigned char> shared_;
  std::vector<Lane> lanes_;
};

inline thread_local Index thread_index, block_index, block_dim, grid_dim;
inline thread_local Block* current_block = nullptr;

inline void sync_threads() { current_block->sync_threads(); }
inline void sync_warp() { current_block->sync_warp(thread_index.x); }
inline unsigned char* shared_memory() { return current_block->shared(); }

// Every lane gets the value lane `source(lane)` of its warp passed.
template <typename T, typename Source>
T shuffle(T v, Source source) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes here");
  const unsigned me = thread_index.x, lane = me & 31u;
  std::memcpy(current_block->lane(me).value, &v, sizeof v);
  current_block->sync_warp(me);
  T other;
  std::memcpy(&other, current_block->lane(me - lane + source(lane)).value, sizeof other);
  current_block->sync_warp(me);  // nobody overwrites a value before every lane has read it
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

// A kernel's contract broken in a way the card would not report (a misaligned or out-of-bounds
// shared-memory access, copies left pending): the test stops here, saying which.
[[noreturn]] inline void contract_broken(const char* what) {
  std::fprintf(stderr, "simt: %s\n", what);
  std::abort();
}

inline void check_shared_16(const void* p, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) contract_broken(what);
  if (!current_block->in_shared(p, 16)) contract_broken(what);
}

// cp.async: a thread's copies wait in its uncommitted group until commit_group closes it, and land
// only when cp.async.wait_group lets their group complete (all but the `pending` newest), so that
// a read before the wait sees the old contents, and a missing wait or barrier fails (or races,
// under TSan) as it would on a card.
struct AsyncCopy {
  void* dst;
  const void* src;
  bool valid;
};
inline thread_local std::vector<AsyncCopy> uncommitted_copies;
inline thread_local std::deque<std::vector<AsyncCopy>> committed_copies;

inline void cp_async(void* dst, const void* src, bool valid) {
  check_shared_16(dst, "cp.async to a misaligned or out-of-bounds shared address");
  uncommitted_copies.push_back({dst, src, valid});
}
inline void cp_async_commit() {
  committed_copies.push_back(std::move(uncommitted_copies));
  uncommitted_copies.clear();
}
inline void cp_async_wait(int pending) {
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
  const unsigned me = thread_index.x, lane = me & 31u, first = me - lane;
  Block::Lane& mine = current_block->lane(me);
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  current_block->sync_warp(me);
  // A's (row, k): lane 4 (row % 8) + (k % 8) / 2, register (row >= 8) + 2 (k >= 8), half k % 2.
  auto a_at = [&](int row, int k) {
    const Block::Lane& owner = current_block->lane(first + 4 * (row % 8) + (k % 8) / 2);
    return bf16_at(owner.a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  // B's (k, col): lane 4 col + (k % 8) / 2, register k >= 8, half k % 2.
  auto b_at = [&](int k, int col) {
    const Block::Lane& owner = current_block->lane(first + 4 * col + (k % 8) / 2);
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
  current_block->sync_warp(me);  // every lane has read the others' registers
  std::memcpy(d, out, sizeof out);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the address of row l % 8 of
// matrix l / 8 (8 consecutive 16-bit elements); register m of lane l receives matrix m's
// (row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1), or with trans its (rows 2 (l % 4) and
// 2 (l % 4) + 1, column l / 4), the first in the low half.
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row, bool trans) {
  check_shared_16(row, "ldmatrix row address misaligned or out of shared memory");
  const unsigned me = thread_index.x, lane = me & 31u, first = me - lane;
  const void* mine = row;
  std::memcpy(current_block->lane(me).value, &mine, sizeof mine);
  current_block->sync_warp(me);
  auto element = [&](unsigned matrix, unsigned row_in, unsigned col) {
    const void* base;
    std::memcpy(&base, current_block->lane(first + 8 * matrix + row_in).value, sizeof base);
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
  current_block->sync_warp(me);  // every lane has read the others' addresses
  std::memcpy(r, out, sizeof out);
}

// Runs kernel() on a grid of grid_x x grid_y blocks of `threads` threads with `shared_bytes` of
// dynamic shared memory, a block at a time.
template <typename Kernel>
void launch(unsigned grid_x, unsigned grid_y, unsigned threads, std::size_t shared_bytes,
            Kernel&& kernel) {
  for (unsigned by = 0; by < grid_y; ++by) {
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      Block block(threads, shared_bytes);
      std::vector<std::thread> pool;
      pool.reserve(threads);
      for (unsigned tx = 0; tx < threads; ++tx) {
        pool.emplace_back([&block, &kernel, bx, by, tx, grid_x, grid_y, threads] {
          thread_index = Index{tx, 0, 0};
          block_index = Index{bx, by, 0};
          block_dim = Index{threads, 1, 1};
          grid_dim = Index{grid_x, grid_y, 1};
          current_block = &block;
          kernel();
          if (!uncommitted_copies.empty() || !committed_copies.empty()) {
            contract_broken("a thread ended with cp.async copies pending");
          }
          block.leave(tx);
        });
      }
      for (std::thread& t : pool) t.join();
    }
  }
}

// A one-dimensional grid.
template <typename Kernel>
void launch(unsigned grid, unsigned threads, std::size_t shared_bytes, Kernel&& kernel) {
  launch(grid, 1, threads, shared_bytes, std::forward<Kernel>(kernel));
}

}  // namespace hpm::simt

#define threadIdx (::hpm::simt::thread_index)
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
