#include "hpm/cli/cli.h"

namespace hpm::cli {
int main(int, char**) { return 0; }
}  // namespace hpm::cli
