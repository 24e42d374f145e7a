#include "hpm/autograd/autocast.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "hpm/tensor/kernels.h"

namespace hpm::autograd {

bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

namespace {

thread_local Precision current = Precision::F32;
thread_local bool outputs_in_bf16 = false;

std::atomic<bool>& fusions_flag() {
  static std::atomic<bool> on{env_switch_on("HPM_BF16_FUSIONS")};
  return on;
}

std::atomic<bool>& copies_flag() {
  static std::atomic<bool> on{env_switch_on("HPM_BF16_GRADIENT_COPIES")};
  return on;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

Precision parse_precision(const std::string& name) {
  if (name == "f32") return Precision::F32;
  if (name == "bf16") return Precision::BF16;
  throw std::invalid_argument("precision must be \"f32\" or \"bf16\", got \"" + name + "\"");
}

const char* precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "f32"; }

Precision autocast_precision() { return current; }

void require_native_bf16() {
  if (kernels::native_bf16()) return;
  throw std::runtime_error(
      "bf16 precision needs a CPU with AVX512_BF16 (native bf16 dot products); this one (" +
      cpu_model() +
      ") has none, and emulating them runs several times slower than f32: use precision = "
      "\"f32\"");
}

AutocastScope::AutocastScope(Precision p) : previous_(current) {
  if (p == Precision::BF16) require_native_bf16();
  current = p;
}

AutocastScope::~AutocastScope() { current = previous_; }

bool bf16_outputs() { return outputs_in_bf16 && current == Precision::BF16 && bf16_fusions(); }

Bf16OutputsScope::Bf16OutputsScope(bool allowed) : previous_(outputs_in_bf16) {
  outputs_in_bf16 = allowed;
}

Bf16OutputsScope::~Bf16OutputsScope() { outputs_in_bf16 = previous_; }

bool bf16_fusions() { return fusions_flag().load(std::memory_order_relaxed); }
void set_bf16_fusions(bool on) { fusions_flag().store(on, std::memory_order_relaxed); }
bool bf16_gradient_copies() {
  return bf16_fusions() && copies_flag().load(std::memory_order_relaxed);
}
void set_bf16_gradient_copies(bool on) { copies_flag().store(on, std::memory_order_relaxed); }

}  // namespace hpm::autograd
