#!/usr/bin/env python3
"""Codistillation in small (Anil et al. 2018), against the same compute spent otherwise, over
several seeds. For each seed, on examples/fortunes_codistill.toml's GPT and both cores:

  codistill    2 copies (threads, 1 kernel thread each), disjoint halves of the training text,
               exchange every 50 steps, distillation after a burn-in of 200 steps, 1000 steps each
  independent  the same 2 copies with alpha 0 on all of the text: two independently seeded runs
               (their churn is the baseline for the codistilled copies' churn)
  alone        one model, 2000 steps of batch 12 on 2 kernel threads: the same examples in all
  mirrored     synchronous data parallelism, 2 replicas, 1000 steps of global batch 24

All evaluate on the same 240 validation windows (the first of the split's sequential sweep).

Every run writes its metrics CSV (validation loss every 50 of its steps). Then `hpm plot` draws
validation loss against compute (in steps of 24 windows: one step of the pair, of mirrored, or
two steps of alone) and against wall clock, each setting as the mean over seeds with its
min-max band, and the script prints the table of final losses and churn.

  ./bench/codistill_experiment.py --seeds 0,1,2 --out docs/codistillation
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HPM = os.path.join(ROOT, "build", "hpm")
CFG = os.path.join(ROOT, "examples", "fortunes_codistill.toml")


def run(args, out, name):
    csv = os.path.join(out, name + ".csv")
    report = os.path.join(out, name + ".json")
    cmd = [HPM] + args + ["--set", f'train.metrics_csv="{csv}"', "--report", report]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(report) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "codistillation"))
    p.add_argument("--plot-only", action="store_true",
                   help="draw and tabulate the runs already in --out")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    os.makedirs(a.out, exist_ok=True)
    results = {k: [] for k in ("codistill", "independent", "alone", "mirrored")}
    for s in seeds if a.plot_only else []:
        for kind in results:
            with open(os.path.join(a.out, f"{kind}-s{s}.json")) as f:
                results[kind].append(json.load(f))
    for s in [] if a.plot_only else seeds:
        seed = ["--seed", str(s)]
        results["codistill"].append(run(["codistill", CFG] + seed, a.out, f"codistill-s{s}"))
        results["independent"].append(run(
            ["codistill", CFG] + seed + ["--set", "codistill.alpha=0",
                                         "--set", 'codistill.shards="identical"'],
            a.out, f"independent-s{s}"))
        results["alone"].append(run(
            ["train", CFG, "--threads", "2"] + seed +
            ["--set", "train.max_steps=2000", "--set", "train.eval_every=100",
             "--set", "schedule.t_max=1900"], a.out, f"alone-s{s}"))
        results["mirrored"].append(run(
            ["train", CFG, "--threads", "2"] + seed +
            ["--set", 'strategy.kind="mirrored"', "--set", "strategy.replicas=2",
             "--set", "data.batch_size=24", "--set", "train.eval_iters=10"],
            a.out, f"mirrored-s{s}"))

    # Curves: every run's CSV (a pair of copies contributes both), x in compute steps.
    def files(kind, copies):
        if copies:
            return [os.path.join(a.out, f"{kind}-s{s}-copy-{c}.csv") for s in seeds for c in (0, 1)]
        return [os.path.join(a.out, f"{kind}-s{s}.csv") for s in seeds]

    # Each CSV row is 50 compute steps further: pairs and mirrored evaluate every 50 of their
    # steps, alone every 100 of its own (each half a compute step).
    series = [("codistilled copies (disjoint halves)", files("codistill", True)),
              ("independent copies (alpha 0)", files("independent", True)),
              ("one model alone (2x steps)", files("alone", False)),
              ("mirrored (2 replicas)", files("mirrored", False))]
    args, labels = [], []
    for label, fs in series:
        args += fs
        labels += [label] * len(fs)
    for x, extra, suffix in (("epoch", ["--x-scale", "50", "--x-label",
                                        "compute steps (24 windows of 64 tokens each)"], "steps"),
                             ("seconds", [], "seconds")):
        out = os.path.join(a.out, f"validation-loss-vs-{suffix}.svg")
        subprocess.run([HPM, "plot"] + args + ["-o", out, "-y", "test_loss", "--x", x,
                                               "--label", ",".join(labels), "--title",
                                               "fortunes GPT, the same compute"] + extra,
                       check=True)

    def stat(values):
        return (f"{statistics.mean(values):.4f} (min {min(values):.4f}, max {max(values):.4f})"
                if values else "-")

    print("\n| setting | final validation loss, mean over seeds (min, max) | churn of top-1 next "
          "tokens between the pair | seconds |")
    print("|---|---|---|---|")
    for kind, rs in results.items():
        if kind in ("codistill", "independent"):
            losses = [l for r in rs for l in r["copy_test_losses"]]
            churn = stat([r["mean_churn"] for r in rs])
        else:
            losses = [r["test_loss"] for r in rs]
            churn = "-"
        seconds = stat([r["seconds"] for r in rs])
        print(f"| {kind} | {stat(losses)} | {churn} | {seconds} |")
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
