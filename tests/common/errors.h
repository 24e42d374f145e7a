// What an error says, for tests that assert it: the message of the exception f throws ("no
// error" when it returns), and whether a message contains a part.
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

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace hpm::testing
