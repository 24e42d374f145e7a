#include "hpm/tensor/random.h"

#include <cmath>

namespace hpm {

namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
__extension__ typedef unsigned __int128 u128;
std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

void Generator::seed_(std::uint64_t seed) {
  std::uint64_t x = seed;
  for (auto& w : s_) w = splitmix64(x);
  has_spare_ = false;
}

std::uint64_t Generator::next_u64() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Generator::uniform() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }

float Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = 0.0;
  do {
    u1 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
  } while (u1 <= 0.0);
  const double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
  has_spare_ = true;
  return static_cast<float>(r * std::cos(2.0 * M_PI * u2));
}

std::uint64_t Generator::below(std::uint64_t n) {
  // Lemire's nearly divisionless method.
  u128 m = static_cast<u128>(next_u64()) * n;
  auto low = static_cast<std::uint64_t>(m);
  if (low < n) {
    const std::uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<u128>(next_u64()) * n;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

namespace {
thread_local Generator* thread_generator = nullptr;
}

Generator& default_generator() {
  static Generator gen(0);
  return thread_generator != nullptr ? *thread_generator : gen;
}

ThreadGeneratorGuard::ThreadGeneratorGuard(Generator& g) : previous_(thread_generator) {
  thread_generator = &g;
}

ThreadGeneratorGuard::~ThreadGeneratorGuard() { thread_generator = previous_; }

void manual_seed(std::uint64_t seed) { default_generator().seed_(seed); }

}  // namespace hpm
