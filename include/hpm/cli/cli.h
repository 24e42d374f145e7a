// The `hpm` command: subcommands train, evaluate; see `hpm --help`.
#pragma once

namespace hpm::cli {
int main(int argc, char** argv);
}
