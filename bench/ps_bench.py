#!/usr/bin/python3
"""Parameter-server training (issue 8), measured.

throughput: push and pull of one 1 MiB and one 64 MiB variable through one parameter-server task
  over loopback (`hpm ps bench`: medians of REPEATS), against the gloo all-reduce of the same size
  between 2 processes (`hpm bench allreduce --backend gloo --world 2`), side by side in one run.
tradeoff: Fashion-MNIST, examples/fashion_ps.toml (mlp 784-128-10, batch 64 per worker, SGD 0.05
  momentum 0.9), 1 parameter-server task, W = 2 and 4 workers, modes async / ssp (staleness 2) /
  sync, with and without worker 0 slowed 3x; steps/s (all workers' tasks per second) and test
  accuracy after each epoch. REPEATS runs each, medians printed.
Every run holds /tmp/hpm-cpu.lock (shared machine).

usage: bench/ps_bench.py [throughput|tradeoff] [--repeats 3] [--epochs 3] [--hpm build/hpm]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def locked(cmd):
    return subprocess.run(["flock", "/tmp/hpm-cpu.lock"] + cmd, check=True, capture_output=True,
                          text=True)


def throughput(hpm, repeats):
    rows = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            ps = os.path.join(d, "ps.json")
            ar = os.path.join(d, "ar.json")
            locked([hpm, "ps", "bench", "--sizes", "1M,64M", "--repeats", "5", "--report", ps])
            locked([hpm, "bench", "allreduce", "--backend", "gloo", "--world", "2", "--sizes",
                    "1M,64M", "--report", ar])
            rows.append((json.load(open(ps)), json.load(open(ar))))
    print("allreduce report keys:", json.dumps(rows[0][1])[:300], file=sys.stderr)
    return rows


def run_job(hpm, workers, mode, slowed, epochs):
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "r.json")
        cmd = [hpm, "launch", "--ps", "1", "--workers", str(workers), "--", hpm, "ps", "run",
               os.path.join(ROOT, "examples", "fashion_ps.toml"), "--set", f"ps.mode={mode}",
               "--set", f"train.epochs={epochs}", "--report", report]
        if slowed:
            cmd += ["--set", "ps.slow_worker=0", "--set", "ps.slow_factor=3"]
        locked(cmd)
        return json.load(open(report))


def tradeoff(hpm, repeats, epochs):
    print(f"| W | worker 0 | mode | steps/s | " +
          " | ".join(f"test acc. epoch {e + 1}" for e in range(epochs)) + " | stale pushes |")
    print("|---|---|---|---|" + "---|" * epochs + "---|")
    for workers in (2, 4):
        for slowed in (False, True):
            for mode in ("async", "ssp", "sync"):
                runs = [run_job(hpm, workers, mode, slowed, epochs) for _ in range(repeats)]
                sps = statistics.median(r["tasks_per_s"] for r in runs)
                accs = [statistics.median(r["epochs"][e]["test_accuracy"] for r in runs)
                        for e in range(epochs)]
                stale = statistics.median(
                    sum(sum(w["staleness_histogram"][1:]) for w in r["per_worker"]) /
                    max(1, sum(w["steps"] for w in r["per_worker"])) for r in runs)
                print(f"| {workers} | {'3x slower' if slowed else 'normal'} | {mode} | {sps:.0f} | " +
                      " | ".join(f"{a:.4f}" for a in accs) + f" | {stale:.2f} |", flush=True)
                print(json.dumps({"workers": workers, "slowed": slowed, "mode": mode,
                                  "runs": runs}), file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["throughput", "tradeoff"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--hpm", default=os.path.join(ROOT, "build", "hpm"))
    a = ap.parse_args()
    if a.what == "throughput":
        for ps, ar in throughput(a.hpm, a.repeats):
            print(json.dumps({"ps": ps, "gloo": ar}))
    else:
        tradeoff(a.hpm, a.repeats, a.epochs)


main()
