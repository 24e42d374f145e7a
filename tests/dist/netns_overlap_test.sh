#!/usr/bin/env bash
# Data-parallel training across two "hosts" through Gloo, and what overlapping the gradient
# all-reduce with backward buys when the network is slow.
#
# Two network namespaces stand in for two hosts: hpm-a-PID (10.77.0.1) and hpm-b-PID (10.77.0.2),
# joined by a veth pair whose two ends are each limited by a token-bucket filter (tc tbf) to
# $RATE. One `hpm train` process runs in each namespace with strategy.kind =
# multi_worker_mirrored: rank 0 hosts the TCP rendezvous store at 10.77.0.1:PORT, rank 1 joins
# from the other namespace, and every gradient all-reduce crosses the shaped link.
#
# The same training runs twice, differing only in [strategy] overlap:
#   overlap = true   each bucket's all-reduce starts as soon as backward has produced all of its
#                    gradients, so communication runs while the rest of backward computes;
#   overlap = false  every all-reduce starts after backward has finished.
# The arithmetic is the same, so both reach the same test accuracy; the overlapped run is faster.
#
# Model: the cnn of examples/fashion_cnn.toml (421,642 parameters, 1.7 MB of gradients per step).
# Its big gradient (the 3136x128 linear layer, 1.6 MB) is produced early in backward, so with
# bucket_mb = 0.5 it gets a bucket of its own whose all-reduce (~45 ms at 300 Mbit/s) hides
# behind the convolutions' backward, which is most of the compute. (The mlp of fashion_mlp.toml
# shows less, ~5-9% here: its big gradient is the first layer's, which backward produces last.)
#
# Usage: netns_overlap_test.sh /path/to/hpm
# Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2 with tc, python3 and the
# Fashion-MNIST files; exits 77 (CTest: skipped) when namespaces cannot be created here.
# Environment: HPM_NETNS_RATE (default 300mbit), HPM_NETNS_REPS (runs per setting, default 2).
set -euo pipefail

HPM=${1:?usage: $0 /path/to/hpm}
RATE=${HPM_NETNS_RATE:-300mbit}
REPS=${HPM_NETNS_REPS:-2}
BUCKET_MB=0.5
DATA_DIR=/usr/share/datasets/fashion-mnist

skip() {
  echo "SKIPPED: $*"
  exit 77
}

[[ -x $HPM ]] || { echo "FAIL: $HPM is not an executable" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "cannot create network namespaces here (not root)"
command -v ip >/dev/null || skip "cannot create network namespaces here (no ip command)"
command -v tc >/dev/null || skip "cannot shape the link here (no tc command)"
command -v python3 >/dev/null || skip "python3 is needed to read the JSON reports"
[[ -f $DATA_DIR/train-images-idx3-ubyte.gz ]] || skip "Fashion-MNIST is not in $DATA_DIR"

NS_A=hpm-a-$$
NS_B=hpm-b-$$
VETH_A=hpm-va-$$  # at most 14 characters (limit 15)
VETH_B=hpm-vb-$$
ADDR_A=10.77.0.1
ADDR_B=10.77.0.2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpm-netns.XXXXXX")
PIDS=()

cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  # Deleting a namespace deletes the veth end inside it, and with it its peer.
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
  ip link del "$VETH_A" 2>/dev/null || true  # if it never made it into its namespace
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- two "hosts" joined by a shaped link -------------------------------------------------------
if ! err=$(ip netns add "$NS_A" 2>&1); then
  skip "cannot create network namespaces here ($err)"
fi
ip netns add "$NS_B"
if ! err=$(ip netns exec "$NS_A" true 2>&1); then
  skip "cannot enter network namespaces here ($err)"
fi
ip link add "$VETH_A" type veth peer name "$VETH_B"
ip link set "$VETH_A" netns "$NS_A"
ip link set "$VETH_B" netns "$NS_B"
ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VETH_A"
ip -n "$NS_B" addr add "$ADDR_B/24" dev "$VETH_B"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "$VETH_A" up
ip -n "$NS_B" link set "$VETH_B" up
if ! err=$(tc -n "$NS_A" qdisc add dev "$VETH_A" root tbf rate "$RATE" burst 64kb latency 50ms 2>&1) ||
   ! err=$(tc -n "$NS_B" qdisc add dev "$VETH_B" root tbf rate "$RATE" burst 64kb latency 50ms 2>&1); then
  skip "cannot limit bandwidth with tc tbf here ($err)"
fi
echo "namespaces $NS_A ($ADDR_A) and $NS_B ($ADDR_B), veth limited to $RATE each way (tc tbf)"

# --- the training: examples/fashion_cnn.toml, cut to a few seconds ------------------------------
CONFIG=$WORK/cnn.toml
cat >"$CONFIG" <<EOF
[model]
layers = [
  { type = "conv2d", in = 1, out = 32, kernel = 3, padding = 1 },
  { type = "relu" },
  { type = "maxpool2d", kernel = 2 },
  { type = "conv2d", in = 32, out = 64, kernel = 3, padding = 1 },
  { type = "relu" },
  { type = "maxpool2d", kernel = 2 },
  { type = "flatten" },
  { type = "linear", in = 3136, out = 128 },
  { type = "relu" },
  { type = "linear", in = 128, out = 10 },
]

[data]
dir = "$DATA_DIR"
batch_size = 64
shuffle = true
train_limit = 3200
test_limit = 1000

[optimizer]
kind = "sgd"
lr = 0.05
momentum = 0.9

[schedule]
kind = "constant"

[train]
epochs = 1
seed = 0
threads = 1

[strategy]
kind = "multi_worker_mirrored"
timeout_s = 60
EOF

# json_field FILE KEY: prints one top-level value of a JSON report.
json_field() {
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

RUN=0
# train_pair OVERLAP: one run of both ranks; leaves rank 0's report in $WORK/run$RUN.json.
train_pair() {
  local overlap=$1 port=$((29500 + RUN)) r0 r1 rc0=0 rc1=0 t0 t1
  RUN=$((RUN + 1))
  local tag=run$RUN
  local args=(train "$CONFIG" --world-size 2 --rendezvous "$ADDR_A:$port"
              --set "strategy.overlap=$overlap" --set "strategy.bucket_mb=$BUCKET_MB")
  t0=$(date +%s.%N)
  timeout 150 ip netns exec "$NS_A" "$HPM" "${args[@]}" --rank 0 --hostname "$ADDR_A" \
    --report "$WORK/$tag.json" >"$WORK/$tag.rank0.log" 2>&1 &
  r0=$!
  timeout 150 ip netns exec "$NS_B" "$HPM" "${args[@]}" --rank 1 --hostname "$ADDR_B" \
    >"$WORK/$tag.rank1.log" 2>&1 &
  r1=$!
  PIDS=("$r0" "$r1")
  wait "$r0" || rc0=$?
  wait "$r1" || rc1=$?
  PIDS=()
  t1=$(date +%s.%N)
  if [[ $rc0 -ne 0 || $rc1 -ne 0 ]]; then
    echo "FAIL: overlap=$overlap: rank 0 exited $rc0, rank 1 exited $rc1" >&2
    for r in 0 1; do echo "--- rank $r:" >&2; cat "$WORK/$tag.rank$r.log" >&2; done
    exit 1
  fi
  printf '%-6s overlap=%-5s  %7.1f samples/s  train %5.2f s  report %5.2f s  elapsed %5.2f s  test_accuracy %s\n' \
    "$tag" "$overlap" "$(json_field "$WORK/$tag.json" train_samples_per_s)" \
    "$(json_field "$WORK/$tag.json" train_seconds)" "$(json_field "$WORK/$tag.json" seconds)" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
    "$(json_field "$WORK/$tag.json" test_accuracy)"
}

# The machine is shared (other processes compete for its cores), so one run can be slowed by
# chance. The two settings are run alternately $REPS times each, and the best of each is compared:
# the exposed all-reduce wait (what must shrink) and the throughput (reported).
echo "cnn, batch 64, 3200 training examples (50 steps), bucket_mb $BUCKET_MB, $REPS run(s) each"
declare -a ON_RUNS=() OFF_RUNS=()
for ((i = 0; i < REPS; i++)); do
  train_pair true
  ON_RUNS+=("$WORK/run$RUN.json")
  train_pair false
  OFF_RUNS+=("$WORK/run$RUN.json")
done

# The link really carried the gradients: bytes the shaped qdisc sent.
echo "bytes through the tbf of $VETH_A: $(tc -s -n "$NS_A" qdisc show dev "$VETH_A" |
  awk '/Sent/ { print $2; exit }')"

python3 - "$REPS" "${ON_RUNS[@]}" "${OFF_RUNS[@]}" <<'EOF'
import json, sys
reps = int(sys.argv[1])
on = [json.load(open(f)) for f in sys.argv[2:2 + reps]]
off = [json.load(open(f)) for f in sys.argv[2 + reps:]]
best_on = max(r["train_samples_per_s"] for r in on)
best_off = max(r["train_samples_per_s"] for r in off)
ratio = best_on / best_off
print(f"best of {reps}: overlap {best_on:.1f} samples/s, no overlap {best_off:.1f} samples/s, "
      f"ratio {ratio:.3f}")
# What overlap changes directly: how long the end of backward waits for the all-reduces (rank 0's
# reducer). Throughput also moves with the machine's load; the exposed wait much less so.
wait_on = min(r["gradient_wait_seconds"] for r in on)
wait_off = min(r["gradient_wait_seconds"] for r in off)
print(f"all-reduce wait after backward, best of {reps}: overlap {wait_on:.2f} s, "
      f"no overlap {wait_off:.2f} s ({wait_on / wait_off:.2f} of it)")
ok = True
accs = [r["test_accuracy"] for r in on + off]
if max(accs) - min(accs) > 0.005:
    print(f"FAIL: test accuracies differ by more than 0.005: {accs}")
    ok = False
else:
    print(f"test accuracy {min(accs):.4f} .. {max(accs):.4f} (same arithmetic)")
if wait_on >= 0.8 * wait_off:
    print(f"FAIL: overlap hid less than a fifth of the all-reduce time after backward")
    ok = False
if ratio <= 1.0:
    # Reported, not failed on: a shared machine can slow one run's compute by more than what
    # overlap saves, which the exposed wait above is immune to.
    print(f"note: the overlapped runs were not faster this time (ratio {ratio:.3f}): a loaded machine?")
sys.exit(0 if ok else 1)
EOF
echo "PASS"
