#!/usr/bin/env bash
# Does whatever set-up is missing, builds, and runs every test with CTest. Then the unit tests
# again under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/). SKIP_SANITIZERS=1 skips
# that second pass.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
ctest --test-dir build --output-on-failure -j "${JOBS:-$(nproc)}"

if [ "${SKIP_SANITIZERS:-0}" != "1" ]; then
  BUILD_DIR=build-asan CMAKE_ARGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DHPM_SANITIZE=ON -DHPM_BUILD_BENCH=OFF" \
    ./scripts/setup.sh
  # OpenMP's runtime keeps thread pools alive at exit; leak checks would only report those.
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "${JOBS:-$(nproc)}" -LE slow
fi
echo "test.sh: all tests passed"
