// The message of the exception f throws ("no error" when it returns): for tests that assert
// what an error says.
#pragma once
#include <exception>
#include <functional>
#include <string>

namespace hpm::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace hpm::testing
