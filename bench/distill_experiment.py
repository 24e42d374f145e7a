#!/usr/bin/env python3
"""Knowledge distillation of a language model under data parallelism, over several seeds.

The teacher is examples/fortunes_gpt_teacher.toml's GPT (6 layers, 192 wide: 2.7M parameters),
trained once by `hpm train` (2000 steps, both cores) into runs/fortunes_teacher unless it is
there already. The student is examples/fortunes_distill.toml's (2 layers, 64 wide), trained for
2000 steps under Mirrored (2 replicas, one kernel thread each). For each seed:

  distilled     hpm distill: (1 - alpha) cross-entropy + alpha T^2 KL toward the teacher
                (alpha 0.9, T 1: chosen over 0.5 and T 2 on a 500-step run of seed 0)
  two teachers  the same with the big teacher and examples/fortunes_gpt.toml's GPT (0.8M,
                trained on first use into runs/fortunes_gpt) averaged with equal weights
  alone         hpm train: the same student, seed, batches and strategy, on the text alone
  alone longer  the same for 8000 steps (cosine over 7900): about the wall clock of a distilled
                run, whose teacher's forward pass costs 4x the student's step

Every run writes its metrics CSV (validation loss on 20 windows every 100 steps) and saves its
model, so `hpm churn` measures the top-1 next-token churn between the seeds of each setting and
between the distilled and the alone student of one seed. Then `hpm plot` draws validation loss
against steps and against wall clock (mean over seeds, min-max band), and the script prints
the tables. A run whose report is already in --out is not run again.

  ./bench/distill_experiment.py --seeds 0,1,2 --out docs/distillation
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HPM = os.path.join(ROOT, "build", "hpm")
STUDENT = os.path.join(ROOT, "examples", "fortunes_distill.toml")
TEACHER = os.path.join(ROOT, "examples", "fortunes_gpt_teacher.toml")
SMALL_TEACHER = os.path.join(ROOT, "examples", "fortunes_gpt.toml")
KINDS = ("distilled", "two_teachers", "alone", "alone_longer")


def hpm(args, quiet=True):
    print("+ hpm", " ".join(args), flush=True)
    subprocess.run([HPM] + args, check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL if quiet else None)


def load(path):
    with open(path) as f:
        return json.load(f)


def two_teacher_config(out):
    """fortunes_distill.toml with both teachers in its [distill] section."""
    with open(STUDENT) as f:
        text = f.read()
    head = text[:text.index("[distill]")]
    path = os.path.join(out, "fortunes_distill_two_teachers.toml")
    with open(path, "w") as f:
        f.write(head + "[distill]\nteachers = [\n"
                f'  {{ config = "{TEACHER}", checkpoint = "runs/fortunes_teacher" }},\n'
                f'  {{ config = "{SMALL_TEACHER}", checkpoint = "runs/fortunes_gpt" }},\n'
                "]\nalpha = 0.9\ntemperature = 1.0\n")
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "distillation"))
    p.add_argument("--plot-only", action="store_true",
                   help="draw and tabulate the runs already in --out")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    os.makedirs(a.out, exist_ok=True)
    ckpt = lambda kind, s: os.path.join(a.out, "checkpoints", f"{kind}-s{s}")  # noqa: E731

    def outputs(kind, s):
        name = os.path.join(a.out, f"{kind}-s{s}")
        return ["--set", f'train.metrics_csv="{name}.csv"', "--set",
                f'train.checkpoint_dir="{ckpt(kind, s)}"', "--report", name + ".json"]

    if not a.plot_only:
        if not os.path.exists(os.path.join(ROOT, "runs", "fortunes_teacher", "latest")):
            hpm(["train", TEACHER, "--report", os.path.join(a.out, "teacher.json"), "--set",
                 f'train.metrics_csv="{os.path.join(a.out, "teacher.csv")}"'])
        two = two_teacher_config(a.out)
        runs = {"distilled": ["distill", STUDENT, "--set", "distill.baseline=false"],
                "two_teachers": ["distill", two],
                "alone": ["train", STUDENT],
                "alone_longer": ["train", STUDENT, "--set", "train.max_steps=8000", "--set",
                                 "schedule.t_max=7900"]}
        for s in seeds:
            for kind, args in runs.items():
                if not os.path.exists(os.path.join(a.out, f"{kind}-s{s}.json")):
                    hpm(args + ["--seed", str(s)] + outputs(kind, s))

    results = {k: [load(os.path.join(a.out, f"{k}-s{s}.json")) for s in seeds] for k in KINDS}

    # Churn of top-1 next tokens on the validation windows: between seeds, and distilled/alone.
    def churn(x, y, name):
        report = os.path.join(a.out, f"churn-{name}.json")
        if not os.path.exists(report):
            hpm(["churn", x, y, STUDENT, "--report", report])
        return load(report)["churn"]

    churns = {k: [churn(ckpt(k, s), ckpt(k, t), f"{k}-s{s}-s{t}")
                  for s, t in itertools.combinations(seeds, 2)] for k in KINDS}
    to_alone = {k: [churn(ckpt("alone", s), ckpt(k, s), f"alone-{k}-s{s}") for s in seeds]
                for k in KINDS if not k.startswith("alone")}

    labels = {"distilled": "distilled from the 2.7M teacher",
              "two_teachers": "distilled from two teachers (2.7M and 0.8M)",
              "alone": "trained alone",
              "alone_longer": "trained alone for 4x the steps"}

    def curves(kinds):
        args, names = [], []
        for k in kinds:
            for s in seeds:
                args.append(os.path.join(a.out, f"{k}-s{s}.csv"))
                names.append(labels[k])
        return args, names

    for x, extra, suffix, kinds in (
            ("epoch", ["--x-scale", "100", "--x-label", "steps"], "steps", KINDS[:3]),
            ("seconds", [], "seconds", KINDS)):
        args, names = curves(kinds)
        hpm(["plot"] + args + ["-o", os.path.join(a.out, f"validation-loss-vs-{suffix}.svg"),
                               "-y", "test_loss", "--x", x, "--label", ",".join(names),
                               "--title", "fortunes GPT student (2 layers, 64 wide), Mirrored x2"]
            + extra)

    def stat(values):
        return (f"{statistics.mean(values):.4f} ({min(values):.4f}-{max(values):.4f})"
                if values else "-")

    teacher = results["distilled"][0]["teachers"][0]
    print(f"\nteacher: {teacher['parameters']} parameters, validation loss "
          f"{teacher['test_loss']:.4f}, token accuracy {teacher['test_accuracy']:.4f}")
    print(f"two teachers' average: validation loss "
          f"{results['two_teachers'][0]['teacher_test_loss']:.4f}\n")
    print("| student | final validation loss, mean (min-max) over seeds | token accuracy | "
          "churn between seeds | churn to the alone student of its seed | seconds |")
    print("|---|---|---|---|---|---|")
    for k in KINDS:
        rs = results[k]
        alone = k.startswith("alone")
        key = "test_loss" if alone else "student_test_loss"
        acc = "test_accuracy" if alone else "student_test_accuracy"
        secs = "seconds" if alone else "student_seconds"
        print(f"| {labels[k]} | {stat([r[key] for r in rs])} | {stat([r[acc] for r in rs])} | "
              f"{stat(churns[k])} | {stat(to_alone.get(k, []))} | "
              f"{stat([r[secs] for r in rs])} |")
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"runs": results, "churn_between_seeds": churns,
                   "churn_to_alone": to_alone}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
