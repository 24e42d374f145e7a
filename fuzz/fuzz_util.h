// What the fuzz targets share: the input as a file (the readers under test open paths, as users'
// files reach them), and the rule that an exception derived from std::exception is the expected
// answer to bad bytes; anything else (a crash, a sanitizer report, a hang, a huge allocation) is a
// finding.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace hpm::fuzz {

// A file holding the current input, one per process (libFuzzer's -jobs run several processes).
class InputFile {
 public:
  explicit InputFile(const char* suffix)
      : path_((std::filesystem::temp_directory_path() /
               ("hpm-fuzz-" + std::to_string(::getpid()) + suffix))
                  .string()) {}
  ~InputFile() { std::remove(path_.c_str()); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& write(const std::uint8_t* data, std::size_t size) {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (f == nullptr) std::abort();
    if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace hpm::fuzz
