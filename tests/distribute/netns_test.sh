#!/usr/bin/env bash
# Data-parallel training across two "hosts" through Gloo: two network namespaces joined by a
# 300 Mbit/s veth pair (scripts/lib/netns_pair.sh), one `hpm train` rank in each under
# multi_worker_mirrored, every gradient all-reduce crossing the shaped link.
#
# What it checks (behaviour, not speed: bench/netns_overlap_bench.sh measures what overlapping
# buys): with the all-reduce overlapped with backward and without, both runs finish within a time
# limit, reach the same test accuracy (the same arithmetic), and the gradients really crossed the
# link (the shaped qdisc sent at least the bytes a ring all-reduce of them must send). Then a GPT
# (examples/fortunes_gpt.toml, 2 layers, 40 steps) trained across the two namespaces reaches the
# validation loss of the same training on one device.
#
# Usage: netns_test.sh /path/to/hpm
# Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2 with tc, python3 and the
# Fashion-MNIST files; exits 77 (CTest: skipped) when namespaces cannot be created here.
set -euo pipefail

HPM=${1:?usage: $0 /path/to/hpm}
NETNS_RATE=300mbit
source "$(dirname "$0")/../../scripts/lib/netns_pair.sh"
netns_pair_up

CONFIG=$NETNS_WORK/cnn.toml
netns_cnn_config "$CONFIG"
STEPS=50                      # 3200 examples, batch 64
GRADIENT_BYTES=$((421642 * 4))  # the cnn's parameters, float32

declare -a REPORTS=() SENT=()
for overlap in true false; do
  before=$(netns_link_bytes)
  netns_train_pair "$CONFIG" --set "strategy.overlap=$overlap" --set strategy.bucket_mb=0.5
  SENT+=($(($(netns_link_bytes) - before)))
  REPORTS+=("$NETNS_WORK/run$NETNS_RUN.json")
done

python3 - "$STEPS" "$GRADIENT_BYTES" "${SENT[@]}" "${REPORTS[@]}" <<'PY'
import json, sys
steps, grad_bytes = int(sys.argv[1]), int(sys.argv[2])
sent = [int(s) for s in sys.argv[3:5]]
on, off = (json.load(open(f)) for f in sys.argv[5:7])
ok = True
for name, r in (("overlap", on), ("no overlap", off)):
    if r["steps"] != steps:
        print(f"FAIL: {name}: {r['steps']} steps, expected {steps}")
        ok = False
if abs(on["test_accuracy"] - off["test_accuracy"]) > 0.005:
    print(f"FAIL: test accuracies differ: overlap {on['test_accuracy']}, no overlap {off['test_accuracy']}")
    ok = False
else:
    print(f"test accuracy {on['test_accuracy']:.4f} and {off['test_accuracy']:.4f} (same arithmetic)")
# A ring all-reduce over 2 ranks sends (n-1)/n of the buffer in reduce-scatter and as much again in
# all-gather: the whole gradient, per step, from each rank.
need = steps * grad_bytes
for name, s in zip(("overlap", "no overlap"), sent):
    print(f"{name}: {s / 1e6:.1f} MB crossed rank 0's end of the link (at least {need / 1e6:.1f} MB expected)")
    if s < need:
        print(f"FAIL: {name}: the gradients did not cross the shaped link")
        ok = False
sys.exit(0 if ok else 1)
PY

# The GPT: both ranks take the same global batch of windows and train on their halves of it, so
# the run is one device's arithmetic up to the order of float additions.
GPT_SETTINGS=(--set model.n_layer=2 --set train.max_steps=40 --set train.eval_every=40
  --set train.eval_iters=10 --set train.seed=3)
"$HPM" train "$(dirname "$0")/../../examples/fortunes_gpt.toml" "${GPT_SETTINGS[@]}" \
  --report "$NETNS_WORK/gpt_one_device.json" >"$NETNS_WORK/gpt_one_device.log" 2>&1
netns_train_pair "$(dirname "$0")/../../examples/fortunes_gpt.toml" "${GPT_SETTINGS[@]}" \
  --set 'strategy.kind="multi_worker_mirrored"'
python3 - "$NETNS_WORK/gpt_one_device.json" "$NETNS_WORK/run$NETNS_RUN.json" <<'PY'
import json, sys
one, two = (json.load(open(f)) for f in sys.argv[1:3])
print(f"gpt: val loss {two['val_loss']:.5f} across the namespaces ({two['replicas_in_sync']} replicas), "
      f"{one['val_loss']:.5f} on one device")
if two["replicas_in_sync"] != 2 or two["steps"] != 40:
    sys.exit(f"FAIL: gpt: {two['replicas_in_sync']} replicas, {two['steps']} steps")
if abs(two["val_loss"] - one["val_loss"]) > 1e-3 * one["val_loss"]:
    sys.exit("FAIL: gpt: the validation losses differ by more than float reassociation")
if not one["val_loss"] < 5.0:
    sys.exit(f"FAIL: gpt: did not learn (val loss {one['val_loss']})")
PY
echo "PASS"
