// The command line speaks in the config layer's terms (Config, load_config, ConfigError, the
// builders): its names, unqualified inside hpm::cli.
#pragma once
#include "hpm/config/config.h"
#include "hpm/config/datasets.h"

namespace hpm::cli {
using namespace hpm::config;  // NOLINT(google-build-using-namespace): the CLI's vocabulary
}  // namespace hpm::cli
