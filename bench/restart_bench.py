#!/usr/bin/python3
"""What fault tolerance costs (issue 5), on Fashion-MNIST.

1. One backup: `hpm train` with train.backup_dir and backup_every_steps, median milliseconds per
   backup and its size, for the mlp and the cnn (from the run's JSON report).
2. From a kill to training again: 2 workers under `hpm launch --max-restarts 1`, worker 1
   SIGKILLed after a step (HPM_FAULT_AT_STEP); the time from the kill to the restarted group's
   "continuing from backup" line (the restored state is loaded and the first step is next),
   read off the launcher's output as it arrives.

usage: bench/restart_bench.py [--repeats 3]
Needs: build/ (scripts/setup.sh).
"""
import argparse, json, os, statistics, subprocess, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HPM = os.path.join(ROOT, "build", "hpm")


def backup_cost(model, limit, every):
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "r.json")
        subprocess.run([HPM, "train", os.path.join(ROOT, "examples", f"fashion_{model}.toml"),
                        "--set", "train.epochs=1", "--set", f"data.train_limit={limit}", "--set", "data.test_limit=500",
                        "--set", f"train.backup_dir={d}/backup", "--set", f"train.backup_every_steps={every}",
                        "--report", report], check=True, stdout=subprocess.DEVNULL)
        r = json.load(open(report))
        return r["backup_seconds"] / r["backups"], r["backup_bytes"]


def kill_to_training(model, limit, every, kill_step):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, HPM_FAULT_AT_STEP=f"1:{kill_step}")
        p = subprocess.Popen([HPM, "launch", "-n", "2", "--max-restarts", "1", "--", HPM, "train",
                              os.path.join(ROOT, "examples", f"fashion_{model}.toml"),
                              "--set", "strategy.kind=multi_worker_mirrored", "--set", "train.epochs=1",
                              "--set", f"data.train_limit={limit}", "--set", "data.test_limit=500",
                              "--set", f"train.backup_dir={d}/backup", "--set", f"train.backup_every_steps={every}"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        killed = resumed = None
        for line in p.stdout:
            now = time.monotonic()
            if killed is None and "fault injection" in line:
                killed = now
            if killed is not None and resumed is None and "continuing from backup" in line:
                resumed = now
        if p.wait() != 0 or killed is None or resumed is None:
            raise RuntimeError("the restart run did not go as planned")
        return resumed - killed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    med = statistics.median
    for model, limit in (("mlp", 12800), ("cnn", 3200)):
        costs = [backup_cost(model, limit, 25) for _ in range(a.repeats)]
        print(f"{model}: one backup {med(c[0] for c in costs) * 1e3:.1f} ms, {costs[0][1] / 1e6:.2f} MB")
    waits = [kill_to_training("mlp", 12800, 50, 120) for _ in range(a.repeats)]
    print(f"mlp, 2 workers: kill to training again {med(waits):.2f} s (median of {a.repeats}: "
          + ", ".join(f"{w:.2f}" for w in waits) + ")")


if __name__ == "__main__":
    main()
