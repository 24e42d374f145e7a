#!/usr/bin/python3
"""Two builds of hpm side by side: `hpm train` of the same example configs from binary A and
binary B, alternating, REPEATS times each, and the medians' ratio B / A of training samples/s.
For "no speed regression" claims: build the older commit into its own directory and compare.

usage: bench/ab_train.py A/hpm B/hpm [--models mlp,cnn] [--threads 1] [--repeats 5]
       [--set section.key=value ...]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402


def samples_per_s(hpm, model, threads, extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        cmd = [hpm, "train", os.path.join(ROOT, "examples", f"fashion_{model}.toml"),
               "--set", "train.epochs=1", "--threads", str(threads), "--report", rep.name]
        for s in extra:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.load(open(rep.name))["train_samples_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    print(peers.machine(), flush=True)
    print("| model | A samples/s | B samples/s | B / A |")
    print("|---|---|---|---|")
    for model in args.models.split(","):
        a, b = [], []
        for _ in range(args.repeats):
            a.append(samples_per_s(args.a, model, args.threads, args.set))
            b.append(samples_per_s(args.b, model, args.threads, args.set))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {model} | {ma:.0f} | {mb:.0f} | {mb / ma:.3f} |", flush=True)


if __name__ == "__main__":
    main()
