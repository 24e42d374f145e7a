// The backend conformance test on cuda:0: every case of common/backend_cases.h (every op of the
// Backend interface, gradients included, odd sizes, NaN and Inf) against the CPU kernel, with the
// GPU's new memory poisoned so that an unwritten output element fails. Then the device itself:
// copies, the allocator's accounting and its OOM, and the errors of devices that are not there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "common/backend_cases.h"
#include "common/cuda_device.h"
#include "hpm/tensor/backend.h"
#include "hpm/tensor/host_read.h"
#include "hpm/tensor/kernels.h"

namespace hpm {
namespace {

using testing::backend_cases::Case;

// How many times `text` occurs in `said` (a test's captured stderr).
std::size_t lines_with(const std::string& said, const std::string& text) {
  std::size_t n = 0;
  for (std::size_t at = said.find(text); at != std::string::npos; at = said.find(text, at + 1)) ++n;
  return n;
}

// The largest difference of x from ref over ref's largest magnitude (at least 1).
float relative_error(const std::vector<float>& x, const std::vector<float>& ref) {
  float worst = 0.0f, size = 1.0f;
  for (std::size_t i = 0; i < ref.size() && i < x.size(); ++i) {
    worst = std::max(worst, std::abs(x[i] - ref[i]));
    size = std::max(size, std::abs(ref[i]));
  }
  return x.size() == ref.size() ? worst / size : INFINITY;
}

TEST(CudaOps, EveryOpMatchesTheCpu) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  std::set<int> ran;
  for (const Case& c : testing::backend_cases::cases()) {
    testing::backend_cases::check(c, gpu);
    ran.insert(static_cast<int>(c.op));
  }
  if (std::getenv("HPM_BACKEND_CASES") != nullptr) return;  // a subset: not every op ran
  for (int op = 0; op < kOps; ++op) {
    EXPECT_GT(dispatch_count(DeviceType::kCuda, static_cast<Op>(op)), 0u)
        << op_name(static_cast<Op>(op)) << " never reached the CUDA backend";
  }
}

TEST(CudaOps, CopiesRoundTripEveryDtypeAndLargeTensors) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  Generator g(3);
  // Larger than the two pinned staging buffers together (2 x 8 MiB), and odd.
  const Tensor big = Tensor::randn({5 * 1024 * 1024 + 3}, g);
  EXPECT_EQ(big.to(gpu).to(Device::cpu()).to_vector(), big.to_vector());
  const std::vector<std::int64_t> ids{-5, 0, 1LL << 40, 7};
  EXPECT_EQ(Tensor::from_i64(ids, {4}, gpu).to_vector_i64(), ids);
  const Tensor u8 = Tensor::from_bytes("bytes on a GPU", gpu);
  EXPECT_EQ(u8.to_bytes(), "bytes on a GPU");
  // Device to device: a clone is a copy, not an alias.
  Tensor a = Tensor::ones({1000}, gpu);
  Tensor b = a.clone();
  kernels::scale_(a, 2.0f);
  EXPECT_EQ(b.to_vector()[999], 1.0f);
  EXPECT_EQ(a.to_vector()[999], 2.0f);
  EXPECT_EQ(kernels::sum_all(a).item(), 2000.0f);
}

TEST(CudaOps, TheAllocatorReusesBlocksAndAccountsLikeTheCpus) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  gpu.empty_cache();
  const MemoryStats before = gpu.stats();
  for (int i = 0; i < 10; ++i) {
    const Tensor t = Tensor::empty({1000, 1000}, DType::F32, gpu);
    // Its size class: at most 1/16 more than asked for.
    const std::size_t held = gpu.stats().current_bytes - before.current_bytes;
    EXPECT_GE(held, 4000000u) << "iteration " << i;
    EXPECT_LE(held, 4000000u + 4000000u / 16) << "iteration " << i;
  }
  const MemoryStats after = gpu.stats();
  EXPECT_EQ(after.allocations - before.allocations, 10u);
  EXPECT_EQ(after.cache_hits - before.cache_hits, 9u) << "the steady state reuses its block";
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_GE(after.peak_bytes, before.current_bytes + 4000000u);
}

TEST(CudaOps, RunningPastTheBudgetIsAnOutOfMemoryErrorNamingTheBytes) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  Device small(DeviceId{DeviceType::kCuda, 0}, "cuda:0 (64 MiB)", std::size_t{64} << 20);
  const Tensor kept = Tensor::ones({1000}, small);
  try {
    Tensor::empty({100, 1024, 1024}, DType::F32, small);
    FAIL() << "no error";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of memory on device 'cuda:0 (64 MiB)'"), std::string::npos) << m;
    EXPECT_NE(m.find("400.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("budget of 64.00 MiB"), std::string::npos) << m;
  }
  // What was there survives.
  EXPECT_EQ(kernels::sum_all(kept).item(), 1000.0f);
  // More than the card has: the device's own OOM, no crash.
  try {
    Tensor::empty({std::int64_t{1} << 42}, DType::F32, gpu);  // 16 TiB
    FAIL() << "no error";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("the device has no more"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kernels::sum_all(kept).item(), 1000.0f);
}

// A bad index does not stop the host at the op (that would be a wait per check): the next copy
// from the device throws the CPU's error, naming op, position and value, once.
TEST(CudaOps, ABadIndexOrLabelIsAnErrorAtTheNextReadNamingIt) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  Generator g(5);
  const Tensor table = Tensor::randn({7, 4}, g).to(gpu);
  const Tensor bad_ids = Tensor::from_i64(std::vector<std::int64_t>{1, 2, 9, 3, 11}, {5}, gpu);
  const Tensor y = kernels::embedding_forward(table, bad_ids);  // returns
  try {
    (void)y.to_vector();
    FAIL() << "no error";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "embedding: index 9 at position 2 out of range for 7 rows");
  }
  EXPECT_EQ(y.to_vector().size(), 20u) << "reported once; the bad rows are zeros";
  EXPECT_EQ(y.to_vector()[8], 0.0f);
  Tensor stats;
  const Tensor logits = Tensor::randn({3, 5}, g).to(gpu);
  const Tensor labels = Tensor::from_i64(std::vector<std::int64_t>{0, -100, 5}, {3}, gpu);
  const Tensor loss = kernels::cross_entropy_forward(logits, labels, 0.0f, stats);
  EXPECT_THROW(loss.item(), std::out_of_range);
  // Logits of a dtype the kernels do not read: an error at the call, as on the CPU.
  EXPECT_THROW(kernels::cross_entropy_forward(Tensor::zeros({3, 5}, DType::I64).to(gpu), labels,
                                              0.0f, stats),
               std::invalid_argument);
  const Tensor nll = kernels::nll_loss_forward(kernels::log_softmax(logits, -1), labels);
  try {
    (void)nll.item();
    FAIL() << "no error";
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("nll_loss: label"), std::string::npos) << e.what();
  }
  // Many checks between reads (more than the device keeps words for) all clear, and good ones
  // report nothing.
  const Tensor good = Tensor::from_i64(std::vector<std::int64_t>{0, 6}, {2}, gpu);
  for (int i = 0; i < 200; ++i) kernels::embedding_forward(table, good);
  EXPECT_EQ(kernels::embedding_forward(table, good).to_vector().size(), 8u);
}

// A read begun on the GPU (HostRead: a pinned slot and an event) holds the values as they were when
// it began, while work issued after it still runs; it judges the index checks issued before it
// (and only those: a later check is the next read's). More reads at once than the device has
// slots are copied on the spot, with the same values.
TEST(CudaOps, AReadBegunBeforeLaterWorkHoldsItsValuesAndJudgesTheChecksBeforeIt) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  Generator g(5);
  Tensor loss = Tensor::scalar(2.5f).to(gpu);
  const Tensor counts = Tensor::from_i64(std::vector<std::int64_t>{3, 4}, {2}, gpu);
  HostRead read({loss, counts});
  const Tensor big = Tensor::randn({4096, 4096}, g).to(gpu);
  for (int i = 0; i < 4; ++i) kernels::matmul(big, big);  // later work, still queued
  kernels::scale_(loss, 10.0f);
  const std::vector<Tensor>& host = read.wait();
  EXPECT_EQ(*host[0].data<float>(), 2.5f);
  EXPECT_EQ(*host[1].data<std::int64_t>(), 3);
  EXPECT_EQ(host[1].data<std::int64_t>()[1], 4);
  EXPECT_EQ(loss.item(), 25.0f);

  const Tensor table = Tensor::randn({7, 4}, g).to(gpu);
  const Tensor bad = Tensor::from_i64(std::vector<std::int64_t>{1, 9}, {2}, gpu);
  const Tensor good = Tensor::from_i64(std::vector<std::int64_t>{1, 2}, {2}, gpu);
  kernels::embedding_forward(table, bad);
  HostRead judged({loss});
  kernels::embedding_forward(table, bad);  // after the read began: not its to judge
  try {
    judged.wait();
    FAIL() << "no error";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "embedding: index 9 at position 1 out of range for 7 rows");
  }
  EXPECT_THROW(judged.wait(), std::out_of_range) << "said again";
  EXPECT_THROW(loss.item(), std::out_of_range) << "the second check, read by the next copy";
  kernels::embedding_forward(table, good);
  EXPECT_EQ(HostRead({loss}).wait().size(), 1u);

  std::vector<HostRead> many;
  for (int i = 0; i < 20; ++i)
    many.emplace_back(std::vector<Tensor>{kernels::add_scalar(loss, static_cast<float>(i))});
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(*many[static_cast<std::size_t>(i)].wait()[0].data<float>(),
              25.0f + static_cast<float>(i))
        << i;
}

// Under HPM_CUDA_LT_AUTOTUNE=1 (gpu_check.sh's tests_autotune step, which runs every conformance
// case so too): a product's shape is timed at its first call, once, and said on stderr. The trials
// of a product that accumulates into its output write scratch, not the output: two accumulations
// are two, not five. The bias epilogue's and the bias gradient's plans tuned alike.
TEST(CudaOps, UnderAutotuneAShapeIsTimedOnceAndItsTrialsLeaveTheOutputAlone) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  const char* on = std::getenv("HPM_CUDA_LT_AUTOTUNE");
  if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "under HPM_CUDA_LT_AUTOTUNE=1 only";
  Generator g(11);
  // Shapes no other test of this program uses: a plan is made once a shape.
  const Tensor a = Tensor::randn({328, 200}, g), b = Tensor::randn({200, 136}, g);
  const Tensor c0 = Tensor::randn({328, 136}, g), bias = Tensor::randn({136}, g);
  Tensor want = c0.clone();
  kernels::matmul_add_(want, a, b);
  kernels::matmul_add_(want, a, b);
  // The epilogues' products in bf16, as a GPT's (the CPU's reference from the same bf16 values).
  const Tensor a16 = kernels::to_bf16(a), c16 = kernels::to_bf16(c0);
  const Tensor w16 = kernels::to_bf16(kernels::transpose2d(b));
  Tensor dw_want = Tensor::zeros({136, 200}, DType::F32, Device::cpu());
  const Tensor db_want = kernels::linear_param_grads_(dw_want, c16, a16, false);
  const Tensor y_want = kernels::linear(a16, w16, bias);

  ::testing::internal::CaptureStderr();
  Tensor got = c0.to(gpu);
  const Tensor a_gpu = a.to(gpu), b_gpu = b.to(gpu);
  kernels::matmul_add_(got, a_gpu, b_gpu);
  kernels::matmul_add_(got, a_gpu, b_gpu);
  Tensor dw = Tensor::zeros({136, 200}, DType::F32, gpu);
  const Tensor a16_gpu = a16.to(gpu);
  const Tensor db = kernels::linear_param_grads_(dw, c16.to(gpu), a16_gpu, false);
  const Tensor y = kernels::linear(a16_gpu, w16.to(gpu), bias.to(gpu));
  const std::vector<float> sums = got.to_vector();  // waits: every line said by now
  const std::string said = ::testing::internal::GetCapturedStderr();

  auto expect_close = [](const std::vector<float>& x, const std::vector<float>& ref,
                         const char* what) {
    ASSERT_EQ(x.size(), ref.size()) << what;
    float worst = 0.0f;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - ref[i]));
    EXPECT_LE(worst, 1e-2f) << what;  // f32 sums of 200 (or 328) terms, in another order
  };
  expect_close(sums, want.to_vector(), "two accumulations");
  expect_close(dw.to_vector(), dw_want.to_vector(), "the weight gradient");
  expect_close(db.to_vector(), db_want.to_vector(), "the bias gradient");
  expect_close(y.to_vector(), y_want.to_vector(), "the product with its bias");
  // Column-major terms (lt_matmul.h): the accumulation's m 136 n 328 k 200, once for two calls.
  EXPECT_EQ(lines_with(said, "hpm: cuBLASLt autotune"), 3u) << said;
  EXPECT_EQ(lines_with(said, "f32 product, no epilogue, m 136 n 328 k 200, accumulating"), 1u)
      << said;
  EXPECT_EQ(lines_with(said, "bias-gradient epilogue, m 200 n 136 k 328"), 1u) << said;
  EXPECT_EQ(lines_with(said, "bias epilogue, m 136 n 328 k 200"), 1u) << said;
}

// Under HPM_CUDA_ATTENTION_CUDNN=1 (gpu_check.sh's tests_cudnn_attention step, which runs the
// attention's conformance cases so too): a GPT's packed attention in a bf16 step runs on cuDNN's
// fused attention, forward and backward (each problem said once on stderr, none left to hpm's
// kernels), its gradient the same bits on every run (cuDNN's deterministic algorithm), and the
// output, lse and gradient within bf16's tolerance of the CPU's.
TEST(CudaOps, UnderCudnnAttentionAGptsAttentionRunsOnCudnnTheSameBitsEachRun) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  const char* on = std::getenv("HPM_CUDA_ATTENTION_CUDNN");
  if (on == nullptr || std::string(on) != "1") {
    GTEST_SKIP() << "under HPM_CUDA_ATTENTION_CUDNN=1 only";
  }
  Generator g(17);
  // The shakespeare model's heads (6 of 64) over 256 positions: a shape no other test of this
  // program uses (a plan is made, and said, once a shape).
  const std::int64_t batch = 4, heads = 6, t = 256, e = 384;
  const Tensor qkv = kernels::to_bf16(Tensor::randn({batch, t, 3 * e}, g));
  const Tensor gy = kernels::to_bf16(Tensor::randn({batch, t, e}, g));
  Tensor lse_want;
  const Tensor y_want = kernels::packed_attention_forward_bf16(qkv, heads, true, 0.125f, lse_want);
  const Tensor dqkv_want = kernels::packed_attention_backward(gy, qkv, y_want, lse_want, heads,
                                                              true, 0.125f, DType::BF16);

  ::testing::internal::CaptureStderr();
  const Tensor qkv_gpu = qkv.to(gpu), gy_gpu = gy.to(gpu);
  Tensor lse;
  const Tensor y = kernels::packed_attention_forward_bf16(qkv_gpu, heads, true, 0.125f, lse);
  const auto backward = [&] {
    return kernels::to_f32(kernels::packed_attention_backward(gy_gpu, qkv_gpu, y, lse, heads, true,
                                                              0.125f, DType::BF16))
        .to_vector();
  };
  const std::vector<float> first = backward(), second = backward();  // the second waits
  const std::string said = ::testing::internal::GetCapturedStderr();

  const std::string problem = "4 x 6 heads, t 256, d 64, causal on cuDNN's plan";
  EXPECT_EQ(lines_with(said, "hpm: cuDNN attention: the forward of " + problem), 1u) << said;
  EXPECT_EQ(lines_with(said, "hpm: cuDNN attention: the backward of " + problem), 1u) << said;
  EXPECT_EQ(lines_with(said, "no plan"), 0u) << said;
  EXPECT_TRUE(first == second) << "two runs differ";
  EXPECT_LE(relative_error(kernels::to_f32(y).to_vector(), kernels::to_f32(y_want).to_vector()),
            2e-2f)
      << "output";
  EXPECT_LE(relative_error(lse.to_vector(), lse_want.to_vector()), 1e-3f) << "lse";
  EXPECT_LE(relative_error(first, kernels::to_f32(dqkv_want).to_vector()), 2e-2f) << "gradient";
}

// GPT-2 small's attention in a training step (16 x 12 heads of 1024 x 64, causal): the backward's
// one pass runs 3,072 key blocks, more than the card holds at once, and the 16 that see a query
// tile add their shares of its dq in turns (ordered_turns.cuh): no block may wait on one not yet
// started (a hang here), and the sums are the same bits on every run. Against the CPU too.
TEST(CudaOps, TheAttentionBackwardAtGpt2SizeIsTheSameBitsEachRun) {
  HPM_CUDA_DEVICE_OR_SKIP(gpu);
  Generator g(13);
  const std::int64_t batch = 16, heads = 12, t = 1024, e = 768;
  const Tensor qkv = kernels::to_bf16(Tensor::randn({batch, t, 3 * e}, g));
  const Tensor gy = Tensor::randn({batch, t, e}, g);
  Tensor lse;
  const Tensor y = kernels::packed_attention_forward_bf16(qkv, heads, true, 0.125f, lse);
  const Tensor want =
      kernels::packed_attention_backward(gy, qkv, y, lse, heads, true, 0.125f, DType::F32);
  const Tensor qkv_gpu = qkv.to(gpu), gy_gpu = gy.to(gpu), y_gpu = y.to(gpu), lse_gpu = lse.to(gpu);
  const auto backward = [&] {
    return kernels::packed_attention_backward(gy_gpu, qkv_gpu, y_gpu, lse_gpu, heads, true, 0.125f,
                                              DType::F32)
        .to_vector();
  };
  const std::vector<float> first = backward(), second = backward();
  EXPECT_TRUE(first == second) << "two runs differ";
  EXPECT_LE(relative_error(first, want.to_vector()), 2e-2f) << "against the CPU";
}

TEST(CudaOps, ADeviceThatIsNotThereIsAnErrorSayingWhatIs) {
  if (!has_backend(DeviceType::kCuda)) GTEST_SKIP() << "this build has no CUDA backend";
  try {
    Device d(DeviceId{DeviceType::kCuda, 7}, "cuda:7");
    FAIL() << "cuda:7 was made";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    // With a GPU: "cuda:7 was asked for, but this machine has 1 CUDA device(s)"; without: what
    // the driver said (no driver, no device).
    EXPECT_TRUE(m.find("cuda:7 was asked for, but this machine has") != std::string::npos ||
                m.find("CUDA") != std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace hpm
