#include "hpm/autograd/weight_cast.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

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
  bool asked = false;  // by bf16_parameter in this scope (not only converted ahead)
};

struct Scope {
  std::map<const TensorImpl*, Entry> cache;
  std::vector<std::weak_ptr<TensorImpl>> asked;  // the parameters asked for, in order
  bool first_seen = false;                       // the scope's first request has come
};
thread_local std::unique_ptr<Scope> scope;

// What each scope asked for, by the first parameter it asked for: a model's step asks for the
// same parameters every step, and a teacher's steps and a student's, alternating on one thread,
// start with different ones. Weak: a model's end frees its parameters. A few models at most.
struct Recipe {
  std::weak_ptr<TensorImpl> first;
  std::vector<std::weak_ptr<TensorImpl>> params;
};
constexpr std::size_t kRecipes = 8;
thread_local std::vector<Recipe> recipes;

bool cacheable(const Tensor& w) {
  return w.dtype() == DType::F32 && w.requires_grad() && w.is_leaf();
}

// At a scope's first request, for w: every parameter the last scope that began with w asked for,
// converted in one to_bf16_many (one launch on a GPU instead of one a parameter) into the cache.
// Converting them now rather than at each first use changes no value: no parameter changes inside
// a scope.
void convert_ahead(const Tensor& w) {
  const auto r = std::find_if(recipes.begin(), recipes.end(),
                              [&](const Recipe& e) { return e.first.lock() == w.impl_ptr(); });
  if (r == recipes.end()) return;
  std::vector<Tensor> sources;
  for (const std::weak_ptr<TensorImpl>& p : r->params) {
    std::shared_ptr<TensorImpl> impl = p.lock();
    if (!impl) continue;
    Tensor t(std::move(impl));
    if (cacheable(t) && t.device().id() == w.device().id() && !scope->cache.contains(t.impl()))
      sources.push_back(std::move(t));
  }
  if (sources.empty()) return;
  const std::vector<Tensor> copies = kernels::to_bf16_many(sources);
  for (std::size_t i = 0; i < sources.size(); ++i)
    scope->cache[sources[i].impl()] = Entry{sources[i], place_of(sources[i]), copies[i]};
}

void remember_recipe() {
  if (scope->asked.empty()) return;
  std::erase_if(recipes, [&](const Recipe& e) {
    return e.first.expired() || e.first.lock() == scope->asked.front().lock();
  });
  if (recipes.size() == kRecipes) recipes.erase(recipes.begin());  // the oldest
  recipes.push_back(Recipe{scope->asked.front(), std::move(scope->asked)});
}

}  // namespace

Tensor bf16_parameter(const Tensor& w) {
  if (!scope || !cacheable(w)) return kernels::to_bf16(w);
  if (!scope->first_seen) {
    scope->first_seen = true;
    convert_ahead(w);
  }
  Entry& e = scope->cache[w.impl()];
  if (!e.copy.defined() || !(e.place == place_of(w)) || !(e.copy.shape() == w.shape())) {
    e = Entry{w, place_of(w), kernels::to_bf16(w)};
  }
  if (!e.asked) {
    e.asked = true;
    scope->asked.push_back(w.impl_ptr());
  }
  return e.copy;
}

WeightCastScope::WeightCastScope() : outermost_(!scope) {
  if (outermost_) scope = std::make_unique<Scope>();
}

WeightCastScope::~WeightCastScope() {
  if (!outermost_) return;
  remember_recipe();
  scope.reset();
}

}  // namespace hpm::autograd
