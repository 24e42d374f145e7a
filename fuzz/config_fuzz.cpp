// The TOML run configuration: parsed and read through every section's schema. Lines after a line
// "#--set" are also applied as --set overrides (KEY=VALUE), which have a parser of their own.
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "hpm/config/config.h"

using namespace hpm;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::InputFile file(".toml");
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  std::size_t end = text.size();
  if (const std::size_t marker = text.find("\n#--set\n"); marker != std::string::npos) {
    end = marker + 1;
    std::size_t at = marker + 8;
    while (at < text.size()) {
      const std::size_t eol = std::min(text.find('\n', at), text.size());
      overrides.push_back(text.substr(at, eol - at));
      at = eol + 1;
    }
  }
  try {
    config::load_config(file.write(data, end), overrides);
  } catch (const std::exception&) {
  }
  return 0;
}
