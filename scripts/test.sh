#!/usr/bin/env bash
# Does whatever set-up is missing, builds, and runs every test with CTest. Then the unit tests
# again under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/), and the threaded input
# pipeline's, the local collectives', offload's, the optimizer's, the pipeline stages' and the
# emulated CUDA kernels' tests under ThreadSanitizer (build-tsan/). SKIP_SANITIZERS=1 skips those
# passes. Last, every libFuzzer target for FUZZ_SECONDS (20) each (scripts/fuzz.sh,
# build-fuzz/); SKIP_FUZZ=1 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase says when it starts (seconds since the script began): where CI's time goes.
phase() { echo "test.sh: $1 at ${SECONDS} s"; }

phase "set-up and Release build"
./scripts/setup.sh
phase "Release tests"
ctest --test-dir build --output-on-failure -j "${JOBS:-$(nproc)}"

if [ "${SKIP_SANITIZERS:-0}" != "1" ]; then
  phase "ASan/UBSan build"
  BUILD_DIR=build-asan CMAKE_ARGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DHPM_SANITIZE=ON -DHPM_BUILD_BENCH=OFF" \
    ./scripts/setup.sh
  phase "ASan/UBSan tests"
  # OpenMP's runtime keeps thread pools alive at exit; leak checks would only report those.
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "${JOBS:-$(nproc)}" -LE slow
  # ThreadSanitizer for the layers that run their own threads (not OpenMP's, whose runtime TSan
  # cannot see into).
  phase "TSan build and tests"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHPM_TSAN=ON -DHPM_BUILD_BENCH=OFF
  tsan_targets="test_data test_comm test_nn test_optim test_pipeline test_distill"
  # The emulated CUDA kernels' test exists where CUDA's headers do. (grep reads the whole list:
  # with -q it would stop at the match, and cmake's SIGPIPE would fail the pipeline under
  # pipefail, now and then skipping these tests without a word.)
  if cmake --build build-tsan --target help | grep '^test_cuda_emulated:' >/dev/null; then
    tsan_targets+=" test_cuda_emulated"
  fi
  # shellcheck disable=SC2086  # the list splits into targets
  cmake --build build-tsan --target $tsan_targets -j "${JOBS:-$(nproc)}"
  TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -L data
  # The local collectives (threads sharing buffers, progress counters, the group barrier).
  TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -L comm -R Local
  # Offload's prefetch thread (moving storages while backward computes). One kernel thread, so
  # that OpenMP's uninstrumented team does not show up as races.
  OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
    ctest --test-dir build-tsan --output-on-failure -L nn -R Offload
  # An optimizer updated in parts from several threads (as pipeline stages do), and the models
  # on a second device type. One kernel thread, as above: OpenMP's team is not instrumented.
  OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
    ctest --test-dir build-tsan --output-on-failure -L optim
  # Pipeline stages on threads exchanging activations by send/recv, stage Devices, the stage pool.
  # (Not the schedules' projection: one thread's arithmetic, 70 s under TSan, 26 under ASan.)
  OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
    ctest --test-dir build-tsan --output-on-failure -L pipeline -E '^Projection\.'
  # Distillation under strategies: replicas running one shared teacher's forward at once (the
  # command tests need the hpm binary, which this build does not make).
  OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
    ctest --test-dir build-tsan --output-on-failure -L distill -E Command
  # CUDA kernels under the CPU's emulation of a block (tests/cuda_emulated/simt.h): a shared-memory
  # access of two threads with no barrier between them is a race here, as racecheck's on a card.
  if [[ " $tsan_targets " == *" test_cuda_emulated "* ]]; then
    OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
      ctest --test-dir build-tsan --output-on-failure -L cuda_emulated -j "${JOBS:-$(nproc)}"
  fi
fi
# The parsers of outside bytes under libFuzzer (clang, ASan + UBSan): a bounded run of each target
# from its committed seed corpus. Longer runs by hand: FUZZ_SECONDS=600 scripts/fuzz.sh TARGET.
if [ "${SKIP_FUZZ:-0}" != "1" ]; then
  phase "fuzz build and runs"
  FUZZ_SECONDS=${FUZZ_SECONDS:-20} ./scripts/fuzz.sh
fi
echo "test.sh: all tests passed in ${SECONDS} s"
