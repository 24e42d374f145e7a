#include "hpm/distribute/ps/cluster.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>

namespace hpm::distribute::ps {

Mode mode_from_name(const std::string& name) {
  if (name == "async") return Mode::kAsync;
  if (name == "ssp") return Mode::kSsp;
  if (name == "sync") return Mode::kSync;
  throw PsError("parameter-server mode must be \"async\", \"ssp\" or \"sync\", got \"" + name +
                "\"");
}

std::string mode_name(Mode m) {
  switch (m) {
    case Mode::kAsync:
      return "async";
    case Mode::kSsp:
      return "ssp";
    case Mode::kSync:
      return "sync";
  }
  return "?";
}

std::string load_token(const std::string& token_file) {
  std::string token;
  if (!token_file.empty()) {
    std::ifstream in(token_file, std::ios::binary);
    if (!in) throw PsError("cannot read the token file " + token_file);
    std::ostringstream os;
    os << in.rdbuf();
    token = os.str();
    if (!token.empty() && token.back() == '\n') token.pop_back();
    if (!token.empty() && token.back() == '\r') token.pop_back();
    if (token.empty()) throw PsError("the token file " + token_file + " is empty");
    return token;
  }
  if (const char* env = std::getenv("HPM_PS_TOKEN"); env != nullptr && *env != '\0') return env;
  throw PsError(
      "no token for the parameter-server RPCs: set [cluster] token_file or the environment "
      "variable HPM_PS_TOKEN");
}

std::vector<int> place_variables(const std::vector<std::int64_t>& numels, int tasks) {
  if (tasks < 1) throw PsError("place_variables: need at least one parameter-server task");
  std::vector<std::size_t> order(numels.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return numels[a] > numels[b]; });
  std::vector<std::int64_t> load(static_cast<std::size_t>(tasks), 0);
  std::vector<int> where(numels.size(), 0);
  for (std::size_t i : order) {
    const auto t = std::min_element(load.begin(), load.end()) - load.begin();
    where[i] = static_cast<int>(t);
    load[static_cast<std::size_t>(t)] += numels[i];
  }
  return where;
}

int port_of(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size())
    throw PsError("address \"" + address + "\" is not HOST:PORT");
  char* end = nullptr;
  const long port = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 0 || port > 65535)
    throw PsError("address \"" + address + "\" has no valid port");
  return static_cast<int>(port);
}

}  // namespace hpm::distribute::ps
