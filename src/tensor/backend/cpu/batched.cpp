// Batched matrix products: a stack of 2-D GEMMs over broadcast batch dimensions.
//
// Legend: a(..., M, K) and b(..., K, N) (before op()), the leading "..." broadcast NumPy-style;
// the result is (batch..., M, N).
#include <stdexcept>

#include "hpm/tensor/backend/cpu.h"
#include "parallel.h"

namespace hpm::cpu {

namespace {

// Batch dimensions of x (all but the last two), padded on the left with 1s to `rank`.
std::vector<std::int64_t> batch_dims(const Shape& s, std::size_t rank) {
  std::vector<std::int64_t> d(rank, 1);
  const auto n = static_cast<std::size_t>(s.rank() - 2);
  for (std::size_t i = 0; i < n; ++i) d[rank - n + i] = s.dims()[i];
  return d;
}

// Offset, in matrices, of batch index `flat` of `out` inside an operand with dims `in`
// (broadcast dimensions of extent 1 stay at index 0).
std::int64_t source_matrix(std::int64_t flat, const std::vector<std::int64_t>& out,
                           const std::vector<std::int64_t>& in) {
  std::int64_t offset = 0, stride = 1;
  for (std::size_t i = out.size(); i-- > 0;) {
    const std::int64_t idx = flat % out[i];
    flat /= out[i];
    if (in[i] != 1) offset += idx * stride;
    stride *= in[i];
  }
  return offset;
}

}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  if (a.dim() < 2 || b.dim() < 2 || a.dtype() != DType::F32 || b.dtype() != DType::F32) {
    throw std::invalid_argument("bmm: expected float tensors of rank >= 2, got " + a.shape().str() +
                                " and " + b.shape().str());
  }
  const std::int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const std::int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const std::int64_t kb = trans_b ? b.size(-1) : b.size(-2);
  const std::int64_t n = trans_b ? b.size(-2) : b.size(-1);
  if (k != kb) {
    throw std::invalid_argument("bmm: inner dimensions differ: " + a.shape().str() +
                                (trans_a ? "^T" : "") + " x " + b.shape().str() +
                                (trans_b ? "^T" : ""));
  }
  const std::size_t rank = static_cast<std::size_t>(std::max(a.dim(), b.dim()) - 2);
  const auto da = batch_dims(a.shape(), rank), db = batch_dims(b.shape(), rank);
  std::vector<std::int64_t> out_dims(rank);
  std::int64_t batches = 1;
  for (std::size_t i = 0; i < rank; ++i) {
    if (da[i] != db[i] && da[i] != 1 && db[i] != 1) {
      throw std::invalid_argument("bmm: batch dimensions do not broadcast: " + a.shape().str() +
                                  " and " + b.shape().str());
    }
    out_dims[i] = std::max(da[i], db[i]);
    batches *= out_dims[i];
  }
  std::vector<std::int64_t> shape = out_dims;
  shape.push_back(m);
  shape.push_back(n);
  Tensor y = Tensor::empty(Shape(shape), DType::F32, a.device());
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
  const std::int64_t lda = a.size(-1), ldb = b.size(-1);
  const std::int64_t sa = a.size(-1) * a.size(-2), sb = b.size(-1) * b.size(-2);
  // Many small products (attention heads): one per thread; few large ones: oneDNN's threads.
  const std::int64_t flops_per = 2 * m * n * k;
  const std::int64_t grain = flops_per >= (1 << 22) ? batches : 1;
  parallel_for(batches, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      gemm(trans_a, trans_b, m, n, k, 1.0f, pa + source_matrix(i, out_dims, da) * sa, lda,
           pb + source_matrix(i, out_dims, db) * sb, ldb, 0.0f, py + i * m * n, n);
    }
  });
  return y;
}

}  // namespace hpm::cpu
