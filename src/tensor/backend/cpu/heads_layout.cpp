// Attention heads between a Linear's (B, T, parts x H x D) rows and the attention kernels'
// (B, H, T, D) heads, one pass each way: the row of D values is the unit that moves, so a
// token's q, k and v rows leave its packed row in one read, and under bf16 are rounded on the
// way (no permute, split or conversion pass of their own).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "hpm/tensor/backend/cpu.h"
#include "parallel.h"

namespace hpm::cpu {

namespace {

struct HeadsLayout {
  std::int64_t batch, t, heads, d;
};

// Moves every D-row between the packed (B, T, parts, H, D) layout and `parts` tensors of
// (B, H, T, D): `move(packed_row, head_row, d)` moves one row whichever way it goes.
template <typename Packed, typename Head, typename Move>
void move_rows(const HeadsLayout& l, std::int64_t parts, Packed* packed, Head* const* heads,
               Move move) {
  const std::int64_t e = l.heads * l.d, rows = l.batch * l.t;
  parallel_for(rows, std::max<std::int64_t>(1, (1 << 14) / (parts * e)),
               [&](std::int64_t lo, std::int64_t hi) {
                 for (std::int64_t r = lo; r < hi; ++r) {
                   const std::int64_t b = r / l.t, t = r % l.t;
                   for (std::int64_t p = 0; p < parts; ++p) {
                     for (std::int64_t h = 0; h < l.heads; ++h) {
                       Packed* row = packed + (r * parts + p) * e + h * l.d;
                       Head* head = heads[p] + ((b * l.heads + h) * l.t + t) * l.d;
                       move(row, head, l.d);
                     }
                   }
                 }
               });
}

// x (B, T, parts x heads x D), its shape and dtype checked by the dispatcher (dispatch.cpp).
HeadsLayout packed_layout(const Tensor& x, std::int64_t parts, std::int64_t heads) {
  return {x.size(0), x.size(1), heads, x.size(2) / (parts * heads)};
}

HeadsLayout heads_layout(const std::vector<const Tensor*>& xs, const char* what) {
  const Tensor& x = *xs[0];
  for (const Tensor* y : xs) {
    if (y->dim() != 4 || y->dtype() != DType::F32 || y->shape() != x.shape()) {
      throw std::invalid_argument(std::string(what) + ": expected F32 (B, H, T, D) heads of " +
                                  "one shape, got " + dtype_name(y->dtype()) + " " +
                                  y->shape().str() + " beside " + x.shape().str());
    }
  }
  return {x.size(0), x.size(2), x.size(1), x.size(3)};
}

void to_head(const float* packed, float* head, std::int64_t n) {
  std::copy(packed, packed + n, head);
}
void bf16_to_head(const std::uint16_t* packed, std::uint16_t* head, std::int64_t n) {
  std::copy(packed, packed + n, head);
}
void to_packed(float* packed, const float* head, std::int64_t n) {
  std::copy(head, head + n, packed);
}

}  // namespace

void split_qkv_heads(const Tensor& qkv, std::int64_t heads, DType dtype, Tensor& q, Tensor& k,
                     Tensor& v) {
  // A BF16 qkv (a product's bf16 output) splits into BF16 heads, its bits moved.
  const HeadsLayout l = packed_layout(qkv, 3, heads);
  const Shape shape{l.batch, l.heads, l.t, l.d};
  q = Tensor::empty(shape, dtype, qkv.device());
  k = Tensor::empty(shape, dtype, qkv.device());
  v = Tensor::empty(shape, dtype, qkv.device());
  if (dtype == DType::BF16) {
    std::uint16_t* out[3] = {q.data<std::uint16_t>(), k.data<std::uint16_t>(),
                             v.data<std::uint16_t>()};
    if (qkv.dtype() == DType::BF16) {
      move_rows(l, 3, qkv.data<std::uint16_t>(), out, bf16_to_head);
      return;
    }
    move_rows(l, 3, qkv.data<float>(), out, f32_to_bf16);
  } else {
    float* out[3] = {q.data<float>(), k.data<float>(), v.data<float>()};
    move_rows(l, 3, qkv.data<float>(), out, to_head);
  }
}

Tensor merge_qkv_heads(const Tensor& q, const Tensor& k, const Tensor& v) {
  const HeadsLayout l = heads_layout({&q, &k, &v}, "merge_qkv_heads");
  Tensor qkv = Tensor::empty({l.batch, l.t, 3 * l.heads * l.d}, DType::F32, q.device());
  const float* in[3] = {q.data<float>(), k.data<float>(), v.data<float>()};
  move_rows(l, 3, qkv.data<float>(), in, to_packed);
  return qkv;
}

Tensor split_heads(const Tensor& x, std::int64_t heads) {
  const HeadsLayout l = packed_layout(x, 1, heads);
  Tensor y = Tensor::empty({l.batch, l.heads, l.t, l.d}, DType::F32, x.device());
  float* out[1] = {y.data<float>()};
  move_rows(l, 1, x.data<float>(), out, to_head);
  return y;
}

Tensor merge_heads(const Tensor& y) {
  const HeadsLayout l = heads_layout({&y}, "merge_heads");
  Tensor x = Tensor::empty({l.batch, l.t, l.heads * l.d}, DType::F32, y.device());
  const float* in[1] = {y.data<float>()};
  move_rows(l, 1, x.data<float>(), in, to_packed);
  return x;
}

}  // namespace hpm::cpu
