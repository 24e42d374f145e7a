#include "hpm/cli/cli.h"

int main(int argc, char** argv) { return hpm::cli::main(argc, argv); }
