// Sums that blocks of one grid add into the same f32 memory in an order fixed in advance, so that
// the result is the same bits on every run: each sum has a turn counter, and a block adds its share
// only when the counter says that the shares ranked before its own are in (FlashAttention-3's
// deterministic backward, CUTLASS's serial split-K: the same acquire/release pattern). Used by
// attention_mma_kernels.cuh's one-pass backward, whose dq rows get a share from every key block.
//
// The counter's progress needs the blocks ranked earlier to be running or done, never waiting for
// a slot behind the waiting block: a launcher gives them lower block indices (blocks start in
// index order). In the CPU's emulation (tests/cuda_emulated/simt.h) blocks run one after another
// in index order, so a turn that has not come when a block asks (a broken ranking, or a turn never
// passed on) is reported as such instead of spinning forever.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/backend/cuda/mma_tiles.cuh"

namespace hpm::cuda {

namespace {

// Waits, as thread 0 of the block, until *turn == rank, then lets the whole block on: every
// thread must call it. What the blocks before wrote is visible to the block after it.
__device__ __forceinline__ void wait_turn(const int* turn, int rank) {
  if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    int seen;
    for (;;) {
      asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(seen) : "l"(turn) : "memory");
      if (seen == rank) break;
      __nanosleep(64);
    }
#elif defined(HPM_SIMT_EMULATION)
    if (::hpm::simt::atomic_add(const_cast<int*>(turn), 0) != rank) {
      ::hpm::simt::contract_broken(
          "a block waits for a turn that no block launched before it passed on");
    }
#else
    __trap();
#endif
  }
  __syncthreads();
}

// Passes the turn on, as thread 0 (other threads: nothing), where every thread of the block has
// written its share before a barrier that thread 0 has passed since: the release orders those
// writes (seen by thread 0 through the barrier) before it. Its fence waits until they are done in
// L2, so a caller may pass a turn some work after the writes, when they are done already.
__device__ __forceinline__ void release_turn(int* turn) {
  if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(turn) : "memory");
#elif defined(HPM_SIMT_EMULATION)
    ::hpm::simt::atomic_add(turn, 1);
#else
    __trap();
#endif
  }
}

// Passes the turn on now that every thread of the block has written its share: every thread must
// call it.
__device__ __forceinline__ void pass_turn(int* turn) {
  __syncthreads();
  release_turn(turn);
}

// Two adjacent f32 of a sum (8-byte aligned) += (lo, hi), performed in L2: one vector reduction
// on sm_90, two scalar ones before.
__device__ __forceinline__ void add_pair(float* dst, float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(lo, hi));
#else
  atomicAdd(dst, lo);
  atomicAdd(dst + 1, hi);
#endif
}

// Two adjacent f32 of a sum, read from L2 (not the SM's L1, which other blocks' writes bypass).
__device__ __forceinline__ float2 load_pair(const float* src) {
#if defined(__CUDA_ARCH__)
  return __ldcg(reinterpret_cast<const float2*>(src));
#else
  return load_as<float2>(src);
#endif
}

}  // namespace

}  // namespace hpm::cuda
