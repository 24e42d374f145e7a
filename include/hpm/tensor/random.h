// Generator: a small, fast, seedable random source (xoshiro256**) whose whole state is four
// words, so checkpoints can save it and recomputation can replay it.
#pragma once
#include <array>
#include <cstdint>

namespace hpm {

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0) { seed_(seed); }
  void seed_(std::uint64_t seed);
  std::uint64_t next_u64();
  float uniform();                       // [0, 1)
  float normal();                        // standard normal (Box-Muller; the spare value is cached)
  std::uint64_t below(std::uint64_t n);  // uniform in [0, n), unbiased

  struct State {
    std::array<std::uint64_t, 4> s{};
    bool has_spare = false;
    float spare = 0.0f;
  };
  State state() const { return {s_, has_spare_, spare_}; }
  void set_state(const State& st) {
    s_ = st.s;
    has_spare_ = st.has_spare;
    spare_ = st.spare;
  }

 private:
  std::array<std::uint64_t, 4> s_{};
  bool has_spare_ = false;
  float spare_ = 0.0f;
};

// The process-wide default generator (seeded by hpm::manual_seed), unless the calling thread has
// one of its own (ThreadGeneratorGuard).
Generator& default_generator();
void manual_seed(std::uint64_t seed);

// Makes `g` the calling thread's default generator for the guard's lifetime, so that replicas
// running on threads of their own (dropout, augmentation) draw from their own streams, without
// racing on the shared one.
class ThreadGeneratorGuard {
 public:
  explicit ThreadGeneratorGuard(Generator& g);
  ~ThreadGeneratorGuard();
  ThreadGeneratorGuard(const ThreadGeneratorGuard&) = delete;
  ThreadGeneratorGuard& operator=(const ThreadGeneratorGuard&) = delete;

 private:
  Generator* previous_;
};

}  // namespace hpm
