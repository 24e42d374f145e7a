#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/: clang, ASan + UBSan, coverage through hpm's libraries) into
# build-fuzz/ and runs each one for FUZZ_SECONDS (default 30; JOBS side by side, the cores' count by
# default) on its committed seed corpus (fuzz/corpus/<target>/; inputs found are kept in
# build-fuzz/corpus/<target>/, not in the tree).
# Prints one line per target: executions, executions per second, coverage (edges, features),
# corpus size. A crash, sanitizer report, timeout (10 s per input) or allocation over 2 GiB stops
# the run with the reproducer's path; the script then fails.
#
#   scripts/fuzz.sh                       # every target, 30 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh idx  # one target, 10 minutes
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(clang libclang-rt-14-dev libomp-dev)
./scripts/install_packages.sh "${PACKAGES[@]}"

TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(tfrecord example idx safetensors config tcp_store ps)
SECONDS_EACH=${FUZZ_SECONDS:-30}

cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHPM_FUZZ=ON -DHPM_BUILD_TESTS=OFF -DHPM_BUILD_BENCH=OFF > /dev/null
cmake --build build-fuzz -j "${JOBS:-$(nproc)}" --target "${TARGETS[@]/#/fuzz_}"

# One target's run; its line (or its failure and the reproducer's path) into build-fuzz/fuzz_T.result.
fuzz_one() {
  local t=$1 log="build-fuzz/fuzz_$1.log" result="build-fuzz/fuzz_$1.result"
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/findings/$t"
  # OpenMP's runtime keeps its thread pools at exit: leak checks would report only those.
  if ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 "build-fuzz/fuzz/fuzz_$t" \
      -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="build-fuzz/findings/$t/" \
      "build-fuzz/corpus/$t" "fuzz/corpus/$t" > "$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]* corp: [0-9]*' "$log" | tail -1)
    printf 'fuzz %-12s ok: %s s, %s executions (%s/s), %s\n' "$t" "$SECONDS_EACH" "$execs" "$rate" \
      "$cov" > "$result"
  else
    { echo "fuzz $t FAILED (log $log, reproducer in build-fuzz/findings/$t/):"
      grep -m1 -A12 -E "ERROR: |runtime error|deadly signal|Timeout|out-of-memory" "$log" ||
        tail -30 "$log"; } > "$result"
    return 1
  fi
}

# The targets side by side, JOBS at once (each runs on one thread: the cores' count by default;
# CI's 7 runs of 20 s in 85 s of wall on 2 cores where one after another took about 145), their
# lines printed in the targets' order once all have ended.
jobs_at_once=${JOBS:-$(nproc)}
for t in "${TARGETS[@]}"; do
  rm -f "build-fuzz/fuzz_$t.result"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait
status=0
for t in "${TARGETS[@]}"; do
  if [ -f "build-fuzz/fuzz_$t.result" ]; then
    cat "build-fuzz/fuzz_$t.result"
    grep -q ' ok: ' "build-fuzz/fuzz_$t.result" || status=1
  else
    echo "fuzz $t FAILED: its run ended without a result (log build-fuzz/fuzz_$t.log)"
    status=1
  fi
done
exit $status
