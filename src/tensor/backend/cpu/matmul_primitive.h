// Batched row-major GEMMs on oneDNN's matmul primitive, f32 or bf16 operands, f32 results (or,
// for bf16 operands, results rounded to bf16 as the primitive writes them):
//   C_i(M,N) = alpha * op(A_i) op(B_i) + beta * C_i,  i < batch,
// each operand's matrices `stride` elements apart. One call runs the whole batch in JIT code,
// where a loop of dnnl_sgemm calls pays a call's overhead per matrix (attention's per-head
// products are 64 x 64). Used by bf16.cpp and attention.cpp.
//
// A primitive is created and JIT-compiled once per problem (everything below plus the thread
// count: oneDNN fixes a primitive's thread split when it is created) and cached. Each call brings
// its own scratchpad (scratchpad_mode::user, a per-thread buffer), so replicas on several threads
// may run one primitive at once.
#pragma once
#include <compare>
#include <cstdint>
#include <string>

namespace hpm::cpu {

struct BatchedGemm {
  bool bf16 = false;    // A and B as bf16 bits, else f32
  bool c_bf16 = false;  // C as bf16 bits (bf16 operands, beta 0), else f32
  bool trans_a = false, trans_b = false;
  std::int64_t batch = 1, m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
  auto operator<=>(const BatchedGemm&) const = default;
};

void run_batched_gemm(const BatchedGemm& g, const void* a, const void* b, void* c);

// oneDNN's name for the implementation the problem runs on ("brg:avx512_core_bf16", ...).
std::string batched_gemm_implementation(const BatchedGemm& g);

}  // namespace hpm::cpu
