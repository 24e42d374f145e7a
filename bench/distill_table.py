#!/usr/bin/env python3
"""The Fashion-MNIST distillation table of docs/distillation.md, in the manner of Hinton et al.'s
MNIST table: teacher, student alone, distilled students, two teachers, M on M, Noisy Student and
codistillation, 3 seeds each.

    OMP_NUM_THREADS=1 python3 bench/distill_table.py --hpm build/hpm --out runs/distill_table \
        --doc docs/distillation.md

Every run is one `hpm` command (with --set overrides) that writes a JSON report into --out; a run
whose report already exists is skipped, so the script resumes where it stopped. Each run holds the
shared CPU lock (flock --lock) while it runs, and only then. The tables go into --doc between the
markers <!-- table:begin --> and <!-- table:end --> (or to stdout without --doc). Spread: each cell
is the mean over the 3 seeds, then min-max. Python 3 standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SEEDS = [0, 1, 2]
STUDENT = "bench/distill/student.toml"
TEACHER_CONFIG = "examples/fashion_cnn.toml"
NOISY = "examples/fashion_noisy_student.toml"
CODISTILL = "examples/fashion_codistill.toml"
# The small-transfer-set setting: the student sees only the first LIMIT training rows (their
# labels for the hard term, the teacher's soft targets on them for the soft one).
LIMIT, LIMIT_EPOCHS = 2000, 40
GRID = [(a, t) for a in (0.5, 0.9) for t in (1, 2, 4, 8)]
FULL_SETTINGS = [(0.5, 2), (0.9, 4)]
TWO_TEACHERS = (0.9, 4)  # alpha, T for two teachers and M on M: fixed before any run


def run(args, name, command):
    """Runs `command` (a list) under the CPU lock unless OUT/name.json exists; returns the report."""
    report = os.path.join(args.out, name + ".json")
    if not os.path.exists(report):
        log = os.path.join(args.out, name + ".log")
        full = ["flock", args.lock] + command + ["--report", report]
        print("run:", " ".join(full), flush=True)
        t0 = time.time()
        with open(log, "w") as f:
            rc = subprocess.call(full, stdout=f, stderr=subprocess.STDOUT,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
        if rc != 0 or not os.path.exists(report):
            sys.exit(f"{name} failed (exit {rc}); see {log}")
        print(f"  {name}: {time.time() - t0:.0f} s", flush=True)
    with open(report) as f:
        return json.load(f)


def teacher_list(args, seeds):
    items = [f'{{config = "../../{TEACHER_CONFIG}", checkpoint = "{args.out}/teacher-{s}"}}'
             for s in seeds]
    return "distill.teachers=[" + ", ".join(items) + "]"


def distill(args, name, seed, teachers, alpha, temp, extra=()):
    return run(args, name, [args.hpm, "distill", STUDENT, "--seed", str(seed),
                            "--set", teacher_list(args, teachers),
                            "--set", f"distill.alpha={alpha}",
                            "--set", f"distill.temperature={float(temp)}", *extra])


def limited(epochs=LIMIT_EPOCHS):
    return ["--set", f"data.train_limit={LIMIT}", "--set", f"train.epochs={epochs}",
            "--set", f"schedule.t_max={epochs}"]


def cell(values, digits=4, percent=False):
    """mean (min-max) over the seeds."""
    if not values:
        return "-"
    k = 100.0 if percent else 1.0
    f = f"{{:.{digits}f}}"
    m = statistics.mean(values) * k
    return f"{f.format(m)} ({f.format(min(values) * k)}-{f.format(max(values) * k)})"


def collect(args):
    r = {}  # row name -> list over seeds
    add = lambda key, v: r.setdefault(key, []).append(v)
    for s in SEEDS:  # the teachers first: every later run loads them
        t = run(args, f"teacher-{s}", [args.hpm, "train", TEACHER_CONFIG, "--set",
                                       f"train.seed={s}", "--set",
                                       f"train.checkpoint_dir={args.out}/teacher-{s}"])
        add("teacher", t["test_accuracy"])
    for s in SEEDS:
        # Full training set (60000 rows), 5 epochs.
        for i, (a, t) in enumerate(FULL_SETTINGS):
            j = distill(args, f"full-s{s}-a{a}-T{t}", s, [s], a, t,
                        ["--set", f"distill.baseline={'true' if i == 0 else 'false'}"])
            add(f"full a={a} T={t}", j["student_test_accuracy"])
            if i == 0:
                add("full alone", j["baseline_student_test_accuracy"])
        # Small transfer set.
        for i, (a, t) in enumerate(GRID):
            j = distill(args, f"lim-s{s}-a{a}-T{t}", s, [s], a, t,
                        limited() + ["--set", f"distill.baseline={'true' if i == 0 else 'false'}"])
            add(f"lim a={a} T={t}", j["student_test_accuracy"])
            if i == 0:
                add("lim alone", j["baseline_student_test_accuracy"])
        a, t = TWO_TEACHERS
        j = distill(args, f"two-s{s}", s, [s, (s + 1) % 3], a, t,
                    limited() + ["--set", "distill.m_on_m=true"])
        add("two teachers: teacher ensemble", j["teacher_test_accuracy"])
        add("two teachers: student", j["student_test_accuracy"])
        add("M on M: ensemble of 2 students", j["m_on_m_test_accuracy"])
        add("M on M: each student", statistics.mean(j["m_on_m_student_test_accuracies"]))
        # Noisy Student.
        j = run(args, f"noisy-s{s}", [args.hpm, "distill", NOISY, "--seed", str(s)])
        add("ns round 0", j["teacher_test_accuracy"])
        for k, rd in enumerate(j["rounds"]):
            add(f"ns round {k + 1}", rd["test_accuracy"])
        # Codistillation: a pair with seeds (10s, 10s+1), codistilled and independent; each copy's
        # checkpoint is kept for the churn across runs below.
        for kind, extra in (("co", []), ("ind", ["--set", "codistill.alpha=0"])):
            j = run(args, f"{kind}-s{s}", [args.hpm, "codistill", CODISTILL, "--seed",
                                           str(10 * s), "--set",
                                           f"train.checkpoint_dir={args.out}/{kind}-s{s}", *extra])
            add(f"{kind} accuracy", j["mean_test_accuracy"])
            add(f"{kind} churn", j["mean_churn"])
    # Churn across runs (Anil et al.'s retraining churn): copy 0 of run s against copy 0 of run
    # s+1, with `hpm churn` on their checkpoints; 3 pairs of differently-seeded runs.
    for kind in ("co", "ind"):
        for s in SEEDS:
            t = (s + 1) % len(SEEDS)
            j = run(args, f"{kind}-churn-s{s}-s{t}",
                    [args.hpm, "churn", f"{args.out}/{kind}-s{s}/copy-0",
                     f"{args.out}/{kind}-s{t}/copy-0", CODISTILL])
            add(f"{kind} churn across runs", j["churn"])
    return r


def table(r):
    L = []
    row = lambda name, key, note="": L.append(f"| {name} | {cell(r.get(key, []))} | {note} |")
    L.append("Each cell: test accuracy, mean over seeds 0, 1, 2, then (min-max).\n")
    L.append("**A. Transfer set = the whole training set (60000 rows), 5 epochs**\n")
    L.append("| model | test accuracy | |")
    L.append("|---|---|---|")
    row("teacher: cnn, 421k parameters, 5 epochs", "teacher")
    row("student alone: mlp 784-64-10, 51k parameters", "full alone")
    for a, t in FULL_SETTINGS:
        row(f"student distilled, alpha {a}, T {t}", f"full a={a} T={t}")
    L.append("")
    L.append(f"**B. Transfer set = the first {LIMIT} training rows, {LIMIT_EPOCHS} epochs** "
             "(the teachers are those of A)\n")
    L.append("| model | test accuracy | |")
    L.append("|---|---|---|")
    row(f"student alone on {LIMIT} rows", "lim alone")
    for a, t in GRID:
        row(f"student distilled, alpha {a}, T {t}", f"lim a={a} T={t}")
    a, t = TWO_TEACHERS
    row("two teachers (seeds s, s+1): their ensemble", "two teachers: teacher ensemble")
    row(f"student of the two teachers' averaged soft targets, alpha {a}, T {t}",
        "two teachers: student")
    row(f"M on M: one student per teacher (alpha {a}, T {t}), each", "M on M: each student")
    row("M on M: the two students' ensemble", "M on M: ensemble of 2 students")
    L.append("")
    L.append("**C. Noisy Student** (examples/fashion_noisy_student.toml: 2000 labelled rows, "
             "58000 unlabelled)\n")
    L.append("| model | test accuracy | |")
    L.append("|---|---|---|")
    row("round 0: mlp 784-256-10 on the 2000 labelled rows (the first teacher)", "ns round 0")
    row("round 1: student of round 0", "ns round 1")
    row("round 2: student of round 1", "ns round 2")
    L.append("")
    L.append("**D. Codistillation** (examples/fashion_codistill.toml: 2 copies of mlp 784-64-10, "
             "seeds 10s and 10s+1, 5 epochs; 3 pairs)\n")
    L.append("| training | test accuracy (mean of the pair) | churn between the pair's two "
             "models | churn across runs: copy 0 of run s vs copy 0 of run s+1 |")
    L.append("|---|---|---|---|")
    for kind, name in (("ind", "independent (alpha 0)"),
                       ("co", "codistilled (alpha 0.5, exchange every 100, burn-in 500)")):
        L.append(f"| {name} | {cell(r.get(kind + ' accuracy', []))} | "
                 f"{cell(r.get(kind + ' churn', []))} | "
                 f"{cell(r.get(kind + ' churn across runs', []))} |")
    return "\n".join(L) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hpm", default="build/hpm")
    p.add_argument("--out", default="runs/distill_table")
    p.add_argument("--lock", default="/tmp/hpm-cpu.lock")
    p.add_argument("--doc", default="", help="markdown file whose table section to replace")
    args = p.parse_args()
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    text = table(collect(args))
    with open(os.path.join(args.out, "table.json"), "w") as f:
        json.dump({"table": text}, f)
    if not args.doc:
        print(text)
        return
    with open(args.doc) as f:
        doc = f.read()
    begin, end = "<!-- table:begin -->\n", "<!-- table:end -->"
    i, k = doc.index(begin) + len(begin), doc.index(end)
    with open(args.doc, "w") as f:
        f.write(doc[:i] + text + doc[k:])
    print(text)


if __name__ == "__main__":
    main()
