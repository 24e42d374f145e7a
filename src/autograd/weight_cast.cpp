#include "hpm/autograd/weight_cast.h"

#include <cstdint>
#include <map>
#include <memory>

#include "hpm/tensor/kernels.h"

namespace hpm::autograd {

namespace {

// Where a tensor's values are (its storage's memory and its offset in it), compared, never read.
struct Place {
  const void* memory;
  std::int64_t offset;
  bool operator==(const Place&) const = default;
};
Place place_of(const Tensor& t) { return {t.impl()->storage->data(), t.impl()->offset}; }

struct Entry {
  Tensor source;  // held, so that no other tensor takes its address while the scope lasts
  Place place;    // where its values were: a moved storage is converted anew
  Tensor copy;
};

thread_local std::unique_ptr<std::map<const TensorImpl*, Entry>> cache;

}  // namespace

Tensor bf16_parameter(const Tensor& w) {
  if (!cache || w.dtype() != DType::F32 || !w.requires_grad() || !w.is_leaf()) {
    return kernels::to_bf16(w);
  }
  Entry& e = (*cache)[w.impl()];
  if (!e.copy.defined() || !(e.place == place_of(w)) || !(e.copy.shape() == w.shape())) {
    e = Entry{w, place_of(w), kernels::to_bf16(w)};
  }
  return e.copy;
}

WeightCastScope::WeightCastScope() : outermost_(!cache) {
  if (outermost_) cache = std::make_unique<std::map<const TensorImpl*, Entry>>();
}

WeightCastScope::~WeightCastScope() {
  if (outermost_) cache.reset();
}

}  // namespace hpm::autograd
