// The oneDNN engine and per-thread stream shared by the kernels built on oneDNN primitives.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

namespace hpm::cpu {

inline dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Streams are cheap but not free to create; with the OpenMP runtime execution is synchronous, so
// one stream per thread suffices and is never shared.
inline dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

}  // namespace hpm::cpu
