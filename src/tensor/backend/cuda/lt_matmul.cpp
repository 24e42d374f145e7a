// cuBLASLt products with a bias or bias-gradient epilogue. A plan (the operation's descriptor,
// the three layouts and the algorithm cuBLASLt's heuristic picked) is made once per shape,
// epilogue and alignment, per host thread (the bias pointer is an attribute of the descriptor,
// set at each call: a thread's own plans need no lock), and reused: the heuristic query costs
// more host time than the launch. Under HPM_CUDA_LT_AUTOTUNE=1 a plan keeps the heuristic's first
// few candidates and, at its first call, times them on the call's operands (lt_autotune.h).
#include "tensor/backend/cuda/lt_matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "hpm/tensor/allocator.h"
#include "tensor/backend/cuda/lt_autotune.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

bool enabled() {
  static const bool on = ab_switch_on("HPM_CUDA_LT_EPILOGUES");
  return on;
}

// The largest power of two up to 256 dividing the address: cuBLASLt's kernels assume operands
// aligned as the heuristic was told, so the alignment is part of a plan's key.
std::uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

struct Key {
  int device = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  bool bf16 = false, tf32 = false, accumulate = false, d_bf16 = false;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0, align_d = 0, align_bias = 0;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = 0;
    auto mix = [&h](std::int64_t v) {
      h ^= std::hash<std::int64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    for (std::int64_t v :
         {std::int64_t{k.device}, std::int64_t{k.epilogue}, std::int64_t{k.op_a},
          std::int64_t{k.op_b}, k.m, k.n, k.k, k.lda, k.ldb, k.ldd, std::int64_t{k.bf16},
          std::int64_t{k.tf32}, std::int64_t{k.accumulate}, std::int64_t{k.d_bf16},
          std::int64_t{k.align_a}, std::int64_t{k.align_b}, std::int64_t{k.align_c},
          std::int64_t{k.align_d}, std::int64_t{k.align_bias}}) {
      mix(v);
    }
    return h;
  }
};

// A column-major layout of rows x cols with leading dimension ld.
cublasLtMatrixLayout_t layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                              std::int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  HPM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(rows),
                                              static_cast<std::uint64_t>(cols), ld));
  return l;
}

const char* epilogue_name(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS     ? "bias"
         : e == CUBLASLT_EPILOGUE_BGRADB ? "bias-gradient"
                                         : "no";
}

const char* input_name(const Key& key) { return key.bf16 ? "bf16" : (key.tf32 ? "tf32" : "f32"); }

// Says once per epilogue (and output type), on stderr, that cuBLASLt offered no algorithm for a
// product (the plain cuBLAS path runs it instead, correct but unfused): on a device run, whether
// the fused epilogues run at all is the first thing to know about them.
void note_no_algorithm(const Key& key) {
  // bias, bias to bf16, bias gradient, none (the plain products, under autotune)
  static std::atomic<bool> said[4] = {false, false, false, false};
  const int kind = key.epilogue == CUBLASLT_EPILOGUE_BIAS     ? (key.d_bf16 ? 1 : 0)
                   : key.epilogue == CUBLASLT_EPILOGUE_BGRADB ? 2
                                                              : 3;
  if (said[kind].exchange(true)) return;
  std::fprintf(stderr,
               "hpm: cuBLASLt has no algorithm for a %s product%s with the %s epilogue (m %lld, "
               "n %lld, k %lld, alignments %u/%u/%u/%u); the plain cuBLAS path runs it (said "
               "once)\n",
               input_name(key), key.d_bf16 ? " to bf16" : "", epilogue_name(key.epilogue),
               static_cast<long long>(key.m), static_cast<long long>(key.n),
               static_cast<long long>(key.k), key.align_a, key.align_b, key.align_d,
               key.align_bias);
}

// "bf16 product to bf16, bias epilogue, m 2304 n 16384 k 768": how the autotune's lines name a
// plan.
std::string describe(const Key& key) {
  char text[160];
  std::snprintf(text, sizeof text, "%s product%s, %s epilogue, m %lld n %lld k %lld%s",
                input_name(key), key.d_bf16 ? " to bf16" : "", epilogue_name(key.epilogue),
                static_cast<long long>(key.m), static_cast<long long>(key.n),
                static_cast<long long>(key.k), key.accumulate ? ", accumulating" : "");
  return text;
}

// A shape the autotune left to the heuristic's first, and why.
void report_not_tuned(const Key& key, const std::string& why) {
  std::fprintf(stderr, "hpm: cuBLASLt autotune: %s: not tuned (%s)\n", describe(key).c_str(),
               why.c_str());
}

// One line a tuned shape: the heuristic's first candidate against the fastest.
void report_tuning(const Key& key, const std::vector<float>& ms, int best) {
  const double flops =
      2.0 * static_cast<double>(key.m) * static_cast<double>(key.n) * static_cast<double>(key.k);
  auto timing = [&](std::size_t i) {
    char text[64];
    std::snprintf(text, sizeof text, "%.4f ms (%.0f TFLOP/s)", static_cast<double>(ms[i]),
                  flops / (std::max(static_cast<double>(ms[i]), 1e-6) * 1e-3) / 1e12);
    return std::string(text);
  };
  const std::string first = ms.empty() || ms[0] < 0.0f ? "refused the call" : timing(0);
  std::string verdict;
  if (best < 0) {
    verdict = "no candidate ran: the first kept";
  } else if (best == 0) {
    verdict = "the fastest of the " + std::to_string(ms.size()) + " timed";
  } else {
    verdict = "candidate " + std::to_string(best + 1) + " of " + std::to_string(ms.size()) + " " +
              timing(static_cast<std::size_t>(best)) + ", kept";
  }
  std::fprintf(stderr, "hpm: cuBLASLt autotune: %s: the heuristic's first %s; %s\n",
               describe(key).c_str(), first.c_str(), verdict.c_str());
}

class Plan {
 public:
  // `bias` only for its alignment (the heuristic reads the pointer, never the memory).
  Plan(const Key& key, const void* bias, std::size_t workspace_bytes) {
    try {
      build(key, bias, workspace_bytes);
    } catch (...) {
      release();  // a cuBLAS error part way: what was made is destroyed, not leaked
      throw;
    }
    if (!usable_) note_no_algorithm(key);
  }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() { release(); }

  bool usable() const { return usable_; }

  // False when cuBLASLt refuses the call after all (the plan is then marked unusable).
  bool run(const LtProduct& p, const void* bias, const Key& key) {
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (!candidates_.empty()) tune(p, key);
    const cublasStatus_t st = launch(p, p.c ? p.c : p.d, p.d, algo_);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
      usable_ = false;
      return false;
    }
    HPM_CUBLAS_CHECK(st);
    return true;
  }

 private:
  cublasStatus_t launch(const LtProduct& p, const void* c, void* d,
                        const cublasLtMatmulAlgo_t& algo) {
    Context& ctx = current_context();
    const float alpha = 1.0f;
    return cublasLtMatmul(ctx.lt, desc_, &alpha, p.a, a_, p.b, b_, &p.beta, c, d_, d, d_, &algo,
                          ctx.workspace, ctx.workspace_bytes, ctx.compute);
  }

  // Times the candidates on this call's operands and keeps the fastest (lt_autotune.h). The
  // trials write D (and a bias gradient) as the call itself is about to; a D that is also the
  // call's C (accumulated into) is read by the trials and written to scratch instead, or, past
  // kMaxScratchBytes, not tuned.
  void tune(const LtProduct& p, const Key& key) {
    std::vector<cublasLtMatmulAlgo_t> candidates;
    candidates.swap(candidates_);  // tuned once, however it ends
    const bool in_place = p.beta != 0.0f && p.c == nullptr;
    const std::int64_t d_elements = p.ldd * p.n;
    const DType d_type = p.d_bf16 ? DType::BF16 : DType::F32;
    constexpr std::int64_t kMaxScratchBytes = std::int64_t{256} << 20;
    const std::int64_t d_bytes = d_elements * static_cast<std::int64_t>(dtype_size(d_type));
    if (in_place && d_bytes > kMaxScratchBytes) {
      report_not_tuned(key, "its output is " + std::to_string(d_bytes >> 20) +
                                " MiB, the trials' scratch at most " +
                                std::to_string(kMaxScratchBytes >> 20));
      return;
    }
    Tensor scratch;
    try {
      if (in_place) scratch = Tensor::empty({d_elements}, d_type, Device::current());
    } catch (const OutOfMemoryError&) {
      // Tuning is a speed-up: no room for its scratch leaves the heuristic's first.
      report_not_tuned(key, "no device memory for the trials' scratch");
      return;
    }
    void* d = in_place ? device_ptr(scratch) : p.d;
    const void* c = p.c ? p.c : p.d;
    const std::vector<float> ms = time_candidates(static_cast<int>(candidates.size()), [&](int i) {
      const cublasStatus_t st = launch(p, c, d, candidates[static_cast<std::size_t>(i)]);
      if (st != CUBLAS_STATUS_NOT_SUPPORTED) HPM_CUBLAS_CHECK(st);
      return st == CUBLAS_STATUS_SUCCESS;
    });
    const int best = fastest(ms);
    if (best >= 0) algo_ = candidates[static_cast<std::size_t>(best)];
    report_tuning(key, ms, best);
  }

  void build(const Key& key, const void* bias, std::size_t workspace_bytes) {
    const cudaDataType_t in = key.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    HPM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F));
    set(CUBLASLT_MATMUL_DESC_TRANSA, key.op_a);
    set(CUBLASLT_MATMUL_DESC_TRANSB, key.op_b);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, key.epilogue);
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    // The bias's type is D's (the default): F32, or BF16 beside a BF16 D (lt_matmul.h).
    const bool ta = key.op_a != CUBLAS_OP_N, tb = key.op_b != CUBLAS_OP_N;
    a_ = layout(in, ta ? key.k : key.m, ta ? key.m : key.k, key.lda);
    b_ = layout(in, tb ? key.n : key.k, tb ? key.k : key.n, key.ldb);
    d_ = layout(key.d_bf16 ? CUDA_R_16BF : CUDA_R_32F, key.m, key.n, key.ldd);

    cublasLtMatmulPreference_t raw = nullptr;
    HPM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw));
    const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                          decltype(&cublasLtMatmulPreferenceDestroy)>
        pref(raw, &cublasLtMatmulPreferenceDestroy);
    auto prefer = [&pref](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
      HPM_CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &value, sizeof(value)));
    };
    prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t{workspace_bytes});
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d);
    // A bf16 D is the f32 result rounded once: no split-K plan that keeps its partial sums in D's
    // type (INPLACE, OUTPUT_TYPE), which would round each part.
    if (key.d_bf16) {
      prefer(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             std::uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE});
    }
    constexpr int kAsk = 8;
    cublasLtMatmulHeuristicResult_t results[kAsk] = {};
    int found = 0;
    // Under autotune, the heuristic's first kAsk, to be timed at the first call.
    const int wanted = lt_autotune_on() ? kAsk : 1;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(current_context().lt, desc_, a_, b_, d_, d_,
                                                       pref.get(), wanted, results, &found);
    if (key.d_bf16 && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {
      // Where the mask itself leaves no algorithm, the heuristic's own choices, filtered: one
      // without split-K, or reducing in f32.
      prefer(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             std::uint32_t{CUBLASLT_REDUCTION_SCHEME_MASK});
      st = cublasLtMatmulAlgoGetHeuristic(current_context().lt, desc_, a_, b_, d_, d_, pref.get(),
                                          kAsk, results, &found);
      int keep = 0;
      for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; ++i) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS || !rounds_once(results[i].algo)) continue;
        results[keep++] = results[i];
      }
      found = keep;
    }
    usable_ = st == CUBLAS_STATUS_SUCCESS && found > 0 && results[0].state == CUBLAS_STATUS_SUCCESS;
    if (usable_) algo_ = results[0].algo;
    for (int i = 0; usable_ && lt_autotune_on() && i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) candidates_.push_back(results[i].algo);
    }
  }

  // Whether an algorithm writes D from f32 sums only: no split-K, or its parts reduced in the
  // compute type.
  static bool rounds_once(const cublasLtMatmulAlgo_t& algo) {
    std::uint32_t splits = 1, scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    std::size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                             sizeof splits, &written) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof scheme, &written) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    return splits <= 1 || scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  }

  void release() noexcept {
    if (d_ != nullptr) cublasLtMatrixLayoutDestroy(d_);
    if (b_ != nullptr) cublasLtMatrixLayoutDestroy(b_);
    if (a_ != nullptr) cublasLtMatrixLayoutDestroy(a_);
    if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
    d_ = b_ = a_ = nullptr;
    desc_ = nullptr;
  }

  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value) {
    HPM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attr, &value, sizeof(value)));
  }

  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  std::vector<cublasLtMatmulAlgo_t> candidates_;  // to time at the first call (autotune), then none
  bool usable_ = false;
};

bool run(const LtProduct& p, cublasLtEpilogue_t epilogue, const void* bias) {
  if (!enabled() || p.m <= 0 || p.n <= 0 || p.k <= 0) return false;
  Context& ctx = current_context();
  Key key;
  key.device = ctx.index;
  key.epilogue = epilogue;
  key.op_a = p.op_a;
  key.op_b = p.op_b;
  key.m = p.m;
  key.n = p.n;
  key.k = p.k;
  key.lda = p.lda;
  key.ldb = p.ldb;
  key.ldd = p.ldd;
  key.bf16 = p.bf16;
  key.tf32 = !p.bf16 && allow_tf32();
  key.accumulate = p.beta != 0.0f;
  key.d_bf16 = p.d_bf16;
  key.align_a = alignment(p.a);
  key.align_b = alignment(p.b);
  key.align_c = alignment(p.c ? p.c : p.d);
  key.align_d = alignment(p.d);
  key.align_bias = alignment(bias);
  thread_local std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;
  std::unique_ptr<Plan>& plan = plans[key];
  if (!plan) plan = std::make_unique<Plan>(key, bias, ctx.workspace_bytes);
  return plan->usable() && plan->run(p, bias, key);
}

}  // namespace

bool lt_matmul(const LtProduct& p) { return run(p, CUBLASLT_EPILOGUE_DEFAULT, nullptr); }

bool lt_matmul_bias(const LtProduct& p, const void* bias) {
  return run(p, CUBLASLT_EPILOGUE_BIAS, bias);
}

bool lt_matmul_bias_grad(const LtProduct& p, float* bias_grad) {
  // HPM_CUDA_LT_BIAS_GRAD=0: the plain product and bias_grad.h's column sums instead, the A/B of
  // run 7's question (its ncu: the epilogue's bias gradient ran as a kernel of its own, after a
  // split-K product at about 480 TFLOP/s).
  static const bool on = ab_switch_on("HPM_CUDA_LT_BIAS_GRAD");
  return on && run(p, CUBLASLT_EPILOGUE_BGRADB, bias_grad);
}

}  // namespace hpm::cuda
