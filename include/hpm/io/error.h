// IoError: the one exception type of the io layer. Every message names the file it concerns and,
// where it helps, the byte offset and what was expected versus found, so a bad checkpoint or data
// file can be diagnosed from the message alone.
#pragma once
#include <stdexcept>
#include <string>

namespace hpm::io {

class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace hpm::io
