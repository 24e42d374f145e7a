#!/usr/bin/python3
"""hpm's input pipeline against PyTorch's DataLoader on the same transform, side by side.

The transform of ../shared/peers/torch_dataloader.py (pad 4 + random 28x28 crop, random flip,
normalize, batch 128, one shuffled pass over the 60k Fashion-MNIST training images), run REPEATS
times alternating: `hpm data bench examples/fashion_augment.toml` (AUTOTUNE) and the DataLoader
with 0 and 2 workers. Prints medians and the ratio against the better DataLoader figure.

usage: bench/data_vs_torch.py [--repeats 5]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402

PEER = os.path.join(peers.PEERS, "torch_dataloader.py")


def hpm(extra=()):
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        subprocess.run([os.path.join(ROOT, "build", "hpm"), "data", "bench",
                        os.path.join(ROOT, "examples", "fashion_augment.toml"), "--report", rep.name, *extra],
                       check=True, capture_output=True, text=True)
        return json.load(open(rep.name))["elements_per_s"]


def peer(workers):
    out = subprocess.run(["/usr/bin/python3", PEER, str(workers), "128"], env=peers.env(), check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["elements_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    peers.install()
    print(peers.machine(), flush=True)
    runs = {"hpm_autotune": [], "hpm_sequential": [], "torch_0_workers": [], "torch_2_workers": []}
    for _ in range(args.repeats):
        runs["hpm_autotune"].append(hpm())
        runs["hpm_sequential"].append(hpm(["--set", "data.parallel_calls=1", "--set", "data.prefetch=0"]))
        runs["torch_0_workers"].append(peer(0))
        runs["torch_2_workers"].append(peer(2))
    med = {k: statistics.median(v) for k, v in runs.items()}
    best_torch = max(med["torch_0_workers"], med["torch_2_workers"])
    row = {k: round(v) for k, v in med.items()}
    row["ratio_autotune_vs_best_torch"] = round(med["hpm_autotune"] / best_torch, 1)
    row["ratio_sequential_vs_best_torch"] = round(med["hpm_sequential"] / best_torch, 1)
    row["repeats"] = args.repeats
    print(json.dumps(row))


if __name__ == "__main__":
    main()
