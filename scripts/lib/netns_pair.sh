# Two "hosts" for hpm on one machine: network namespaces joined by a bandwidth-limited veth pair.
# Sourced (not run) by tests/distribute/netns_test.sh and bench/netns_overlap_bench.sh, which share it
# so that the test and the benchmark train across the same link.
#
# hpm-a-PID (10.77.0.1) and hpm-b-PID (10.77.0.2) are joined by a veth pair whose two ends are
# each limited by a token-bucket filter (tc tbf) to NETNS_RATE. One `hpm train` process runs in
# each namespace with strategy.kind = multi_worker_mirrored: rank 0 hosts the TCP rendezvous store
# at 10.77.0.1:PORT, rank 1 joins from the other namespace, and every gradient all-reduce crosses
# the shaped link.
#
# Caller sets HPM (the binary) and NETNS_RATE, then calls netns_pair_up; netns_train_pair runs one
# training of both ranks. A missing capability ends the caller with exit 77 (CTest: skipped).

NETNS_DATA_DIR=/usr/share/datasets/fashion-mnist
NS_A=hpm-a-$$
NS_B=hpm-b-$$
VETH_A=hpm-va-$$  # at most 14 characters (limit 15)
VETH_B=hpm-vb-$$
ADDR_A=10.77.0.1
ADDR_B=10.77.0.2
NETNS_WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpm-netns.XXXXXX")
NETNS_PIDS=()
NETNS_RUN=0

netns_skip() {
  echo "SKIPPED: $*"
  exit 77
}

netns_cleanup() {
  local p
  for p in "${NETNS_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${NETNS_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  # Deleting a namespace deletes the veth end inside it, and with it its peer.
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
  ip link del "$VETH_A" 2>/dev/null || true  # if it never made it into its namespace
  rm -rf "$NETNS_WORK"
}

# netns_pair_up: checks what is needed, creates the two namespaces and the shaped link.
netns_pair_up() {
  [[ -x $HPM ]] || { echo "FAIL: $HPM is not an executable" >&2; exit 1; }
  [[ $(id -u) -eq 0 ]] || netns_skip "cannot create network namespaces here (not root)"
  command -v ip >/dev/null || netns_skip "cannot create network namespaces here (no ip command)"
  command -v tc >/dev/null || netns_skip "cannot shape the link here (no tc command)"
  command -v python3 >/dev/null || netns_skip "python3 is needed to read the JSON reports"
  [[ -f $NETNS_DATA_DIR/train-images-idx3-ubyte.gz ]] ||
    netns_skip "Fashion-MNIST is not in $NETNS_DATA_DIR"

  trap netns_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  local err
  if ! err=$(ip netns add "$NS_A" 2>&1); then
    netns_skip "cannot create network namespaces here ($err)"
  fi
  ip netns add "$NS_B"
  if ! err=$(ip netns exec "$NS_A" true 2>&1); then
    netns_skip "cannot enter network namespaces here ($err)"
  fi
  ip link add "$VETH_A" type veth peer name "$VETH_B"
  ip link set "$VETH_A" netns "$NS_A"
  ip link set "$VETH_B" netns "$NS_B"
  ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VETH_A"
  ip -n "$NS_B" addr add "$ADDR_B/24" dev "$VETH_B"
  local ns
  for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
  ip -n "$NS_A" link set "$VETH_A" up
  ip -n "$NS_B" link set "$VETH_B" up
  if ! err=$(tc -n "$NS_A" qdisc add dev "$VETH_A" root tbf rate "$NETNS_RATE" burst 64kb latency 50ms 2>&1) ||
     ! err=$(tc -n "$NS_B" qdisc add dev "$VETH_B" root tbf rate "$NETNS_RATE" burst 64kb latency 50ms 2>&1); then
    netns_skip "cannot limit bandwidth with tc tbf here ($err)"
  fi
  echo "namespaces $NS_A ($ADDR_A) and $NS_B ($ADDR_B), veth limited to $NETNS_RATE each way (tc tbf)"
}

# netns_cnn_config FILE: the cnn of examples/fashion_cnn.toml cut to 50 steps, under
# multi_worker_mirrored. Its big gradient (the 3136x128 linear layer, 1.6 MB of 1.7 MB) is
# produced early in backward, so with small buckets its all-reduce can hide behind the
# convolutions' backward.
netns_cnn_config() {
  cat >"$1" <<EOF2
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
dir = "$NETNS_DATA_DIR"
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
EOF2
}

# netns_json_field FILE KEY: prints one top-level value of a JSON report.
netns_json_field() {
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# netns_train_pair CONFIG [--set k=v]...: one training of both ranks, each in its namespace, with
# a time limit (a hang fails instead of blocking CI). Leaves rank 0's report in
# $NETNS_WORK/run$NETNS_RUN.json and prints one line about the run.
netns_train_pair() {
  local config=$1
  shift
  local port=$((29500 + NETNS_RUN)) r0 r1 rc0=0 rc1=0 t0 t1
  NETNS_RUN=$((NETNS_RUN + 1))
  local tag=run$NETNS_RUN
  local args=(train "$config" --world-size 2 --rendezvous "$ADDR_A:$port" "$@")
  t0=$(date +%s.%N)
  timeout 150 ip netns exec "$NS_A" "$HPM" "${args[@]}" --rank 0 --hostname "$ADDR_A" \
    --report "$NETNS_WORK/$tag.json" >"$NETNS_WORK/$tag.rank0.log" 2>&1 &
  r0=$!
  timeout 150 ip netns exec "$NS_B" "$HPM" "${args[@]}" --rank 1 --hostname "$ADDR_B" \
    >"$NETNS_WORK/$tag.rank1.log" 2>&1 &
  r1=$!
  NETNS_PIDS=("$r0" "$r1")
  wait "$r0" || rc0=$?
  wait "$r1" || rc1=$?
  NETNS_PIDS=()
  t1=$(date +%s.%N)
  if [[ $rc0 -ne 0 || $rc1 -ne 0 ]]; then
    echo "FAIL: $*: rank 0 exited $rc0, rank 1 exited $rc1 (124: timed out)" >&2
    local r
    for r in 0 1; do echo "--- rank $r:" >&2; cat "$NETNS_WORK/$tag.rank$r.log" >&2; done
    exit 1
  fi
  printf '%-6s %-60s %7.1f samples/s  train %5.2f s  elapsed %5.2f s  test_accuracy %s\n' \
    "$tag" "$*" "$(netns_json_field "$NETNS_WORK/$tag.json" train_samples_per_s)" \
    "$(netns_json_field "$NETNS_WORK/$tag.json" train_seconds)" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
    "$(netns_json_field "$NETNS_WORK/$tag.json" test_accuracy)"
}

# netns_link_bytes: bytes the shaped qdisc of rank 0's end has sent so far.
netns_link_bytes() {
  tc -s -n "$NS_A" qdisc show dev "$VETH_A" | awk '/Sent/ { print $2; exit }'
}
