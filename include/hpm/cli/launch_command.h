// `hpm launch`: the flags of the process supervisor (hpm/launch/supervisor.h).
#pragma once
#include "hpm/launch/supervisor.h"

namespace CLI {
class App;
}

namespace hpm::cli {

// Adds the `launch` subcommand to `app`; parsing fills `options` (run them with
// launch::run_launch).
CLI::App* add_launch_command(CLI::App& app, launch::LaunchOptions& options);

}  // namespace hpm::cli
