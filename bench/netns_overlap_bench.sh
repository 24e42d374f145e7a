#!/usr/bin/env bash
# What overlapping the gradient all-reduce with backward buys when the network is slow: the cnn
# trained by multi_worker_mirrored across two network namespaces joined by a shaped veth pair
# (scripts/lib/netns_pair.sh, the same link as tests/distribute/netns_test.sh).
#
#   overlap = true   each bucket's all-reduce starts as soon as backward has produced all of its
#                    gradients, so communication runs while the rest of backward computes;
#   overlap = false  every all-reduce starts after backward has finished.
#
# Prints, with the machine's CPU, medians over REPS alternating runs of each setting: training
# samples/s and the all-reduce wait after backward (rank 0's reducer), and their ratios. How much
# can hide depends on the machine: a faster core has a shorter backward to hide the all-reduce
# behind, so the fraction hidden shrinks as the CPU gets faster at a fixed link rate.
#
# Usage: bench/netns_overlap_bench.sh build/hpm [REPS (default 3)] [RATE (default 300mbit)]
# Needs root; see the library for the rest.
set -euo pipefail

HPM=${1:?usage: $0 /path/to/hpm [REPS] [RATE]}
REPS=${2:-3}
NETNS_RATE=${3:-300mbit}
BUCKET_MB=0.5
source "$(dirname "$0")/../scripts/lib/netns_pair.sh"
netns_pair_up

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
  "$(grep -o -m1 -w -e avx512f -e avx512_bf16 /proc/cpuinfo | sort -u | tr '\n' ' ')"
CONFIG=$NETNS_WORK/cnn.toml
netns_cnn_config "$CONFIG"
echo "cnn, batch 64, 50 steps, bucket_mb $BUCKET_MB, $REPS run(s) of each setting, alternating"

declare -a ON=() OFF=()
for ((i = 0; i < REPS; i++)); do
  for overlap in true false; do
    netns_train_pair "$CONFIG" --set "strategy.overlap=$overlap" --set "strategy.bucket_mb=$BUCKET_MB"
    if [[ $overlap == true ]]; then ON+=("$NETNS_WORK/run$NETNS_RUN.json"); else OFF+=("$NETNS_WORK/run$NETNS_RUN.json"); fi
  done
done

python3 - "$REPS" "$NETNS_RATE" "${ON[@]}" "${OFF[@]}" <<'PY'
import json, statistics, sys
reps, rate = int(sys.argv[1]), sys.argv[2]
on = [json.load(open(f)) for f in sys.argv[3:3 + reps]]
off = [json.load(open(f)) for f in sys.argv[3 + reps:]]
med = lambda rs, k: statistics.median(r[k] for r in rs)
sps_on, sps_off = med(on, "train_samples_per_s"), med(off, "train_samples_per_s")
wait_on, wait_off = med(on, "gradient_wait_seconds"), med(off, "gradient_wait_seconds")
print(f"link {rate}, medians of {reps}:")
print(f"  samples/s          overlap {sps_on:8.1f}   no overlap {sps_off:8.1f}   ratio {sps_on / sps_off:.3f}x")
print(f"  wait after backward overlap {wait_on:7.2f} s  no overlap {wait_off:7.2f} s  "
      f"hidden {1 - wait_on / wait_off:.1%} of the wait")
PY
