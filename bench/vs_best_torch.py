#!/usr/bin/python3
"""hpm against PyTorch at its best, side by side in one run: for each row (model, threads,
precision), hpm and every PyTorch configuration installed here, in the same precision, alternating
REPEATS times; per row the medians, the best PyTorch configuration and which one it was, the ratio
hpm / best, and each side's FLOP rate as a fraction of this machine's physical limit measured in
the same run (the f32 SGEMM peak for f32 rows, the bf16 GEMM peak for bf16 rows: bench/sgemm_peak).

PyTorch configurations (those not installed are skipped with a note):
  debian-eager-blas   Debian's python3-torch 1.13 (/usr/bin/python3), eager, PEER_THREADS_TO=blas
  debian-eager-torch  the same with PEER_THREADS_TO=torch (2+ threads only: at 1 thread both are one)
  venv-eager          today's PyTorch 2.x from the package index, in the virtual environment that
                      `scripts/setup_peers.sh --torch2` makes (.peers/torch2, or HPM_TORCH2_VENV)
  venv-compile        the same under torch.compile (1.13 has no torch.compile)
peer_env.py leaves a wheel's torch alone (its own BLAS and thread pool), so PEER_THREADS_TO only
matters for Debian's 1.13. bf16 rows: torch.autocast("cpu", dtype=torch.bfloat16) around forward
and loss (f32 weights and optimizer), hpm's `[train] precision = "bf16"`.

Rows:
  mlp, cnn         examples/fashion_{mlp,cnn}.toml against bench/torch_fmnist_peer.py, batch 64,
                   one epoch (937 steps) unless --steps
  gpt              examples/fortunes_gpt.toml at torch_gpt.py's defaults (4 layers, 4 heads, 128
                   wide, block 64, batch 12), 200 steps unless --steps
  gpt-shakespeare  nanoGPT's shakespeare_char size, 10.8M parameters (6 layers, 6 heads, 384 wide,
                   block 256, batch 16), 30 steps unless --steps
Timing: both sides time the training step alone (batch drawing excluded). PyTorch's first --skip
steps (default 5) are run but not timed in every configuration (torch.compile compiles in the
first); hpm's rate is over the steps after its first (oneDNN makes its kernels then), or over
every step with --hpm-first-step.

usage: bench/vs_best_torch.py [--models mlp,cnn,gpt,gpt-shakespeare] [--threads 1,2]
                              [--precisions f32,bf16] [--repeats 3] [--steps N] [--skip 5]
                              [--configs NAME,...] [--torch2 VENV] [--json FILE] [--prune F]
                              [--hpm-first-step]
Needs build/ (scripts/setup.sh); installs the Debian peers itself (scripts/setup_peers.sh), not the
venv (several GB: scripts/setup_peers.sh --torch2). bf16 needs AVX512_BF16 for hpm.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402
from gpt_vs_torch import SIZES, flops_per_token  # noqa: E402
from fmnist_vs_torch import FLOPS_PER_SAMPLE  # noqa: E402

HPM = os.path.join(ROOT, "build", "hpm")
FMNIST_PEER = os.path.join(ROOT, "bench", "torch_fmnist_peer.py")
GPT_PEER = os.path.join(peers.PEERS, "torch_gpt.py")
DEBIAN_PYTHON = "/usr/bin/python3"
MODELS = ["mlp", "cnn", "gpt", "gpt-shakespeare"]
DEFAULT_STEPS = {"mlp": None, "cnn": None, "gpt": 200, "gpt-shakespeare": 30}  # None: one epoch
GPT_SIZE = {"gpt": "default", "gpt-shakespeare": "shakespeare"}
CONFIGS = ["debian-eager-blas", "debian-eager-torch", "venv-eager", "venv-compile"]
# hpm's rate over the steps after its first (where oneDNN makes its kernels), as PyTorch's runs
# leave their first --skip steps untimed; "" (--hpm-first-step) counts every step.
AFTER_FIRST = "_after_first_step"


class RunFailed(Exception):
    pass


def run(cmd, env=None):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        lines = [l for l in (p.stderr + p.stdout).strip().splitlines() if l.strip()]
        raise RunFailed(f"exit {p.returncode}: {lines[-1][:300] if lines else '(no output)'}")
    return p.stdout


def torch_version(python):
    """The torch version `python` imports, or None where it has none."""
    if not os.access(python, os.X_OK):
        return None
    p = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None


def fmnist_config(model, steps):
    """The example's config and the --set that cut it to one epoch, or to `steps` steps (a --set of
    max_steps replaces the file's epochs)."""
    src = os.path.join(ROOT, "examples", f"fashion_{model}.toml")
    if steps is None:
        return src, ["--set", "train.epochs=1"]
    return src, ["--set", f"train.max_steps={steps}", "--set", f"train.eval_every={steps}"]


def hpm(model, threads, precision, steps):
    """hpm's training rate: samples/s for the Fashion-MNIST models, tokens/s for the GPTs."""
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        if model in GPT_SIZE:
            s = SIZES[GPT_SIZE[model]]
            sets = {"model.n_layer": s["layers"], "model.n_head": s["heads"], "model.n_embd": s["embd"],
                    "model.block_size": s["block"], "data.batch_size": s["batch"],
                    "train.max_steps": steps, "train.eval_every": steps, "train.eval_iters": 1,
                    "schedule.t_max": max(1, steps - 100), "schedule.warmup": min(100, steps - 1)}
            config, extra = os.path.join(ROOT, "examples", "fortunes_gpt.toml"), []
            for k, v in sets.items():
                extra += ["--set", f"{k}={v}"]
            key = "train_tokens_per_s" + AFTER_FIRST
        else:
            config, extra = fmnist_config(model, steps)
            key = "train_samples_per_s" + AFTER_FIRST
        run([HPM, "train", config, "--threads", str(threads), "--report", rep.name,
             "--set", f'train.precision="{precision}"'] + extra)
        return json.load(open(rep.name))[key]


def torch_run(python, mode, compiled, model, threads, precision, steps, skip):
    """One PyTorch run's training rate (samples/s or tokens/s) and its JSON line."""
    flags = ["--precision", precision, "--skip", str(skip)] + (["--compile"] if compiled else [])
    if model in GPT_SIZE:
        s = SIZES[GPT_SIZE[model]]
        cmd = [python, GPT_PEER, "--timing-only", "--iters", str(steps), "--threads", str(threads)] + flags + \
              sum([[f"--{k}", str(v)] for k, v in s.items()], [])
        key = "train_tokens_per_s"
    else:
        cmd = [python, FMNIST_PEER, model, "1", "64", str(threads)] + flags + \
              (["--steps", str(steps)] if steps else [])
        key = "train_samples_per_s"
    out = run(cmd, env=peers.env(mode))
    line = json.loads(out.strip().splitlines()[-1])
    return line[key], line


def peaks(threads, tries=3):
    """bench/sgemm_peak's line: the f32 SGEMM peak, and where it measures them the bf16 GEMM peak
    and memcpy bandwidth (keys bf16_gemm_1024_gflops, memcpy_gbytes_per_s). Each the best of
    `tries` runs (a limit is what the machine reaches at best; one run lasts well under a second,
    and a busy neighbour pulls it down)."""
    runs = [json.loads(run([os.path.join(ROOT, "build", "bench", "sgemm_peak"), str(threads)])) for _ in range(tries)]
    best = lambda k: max((d[k] for d in runs if d.get(k) is not None), default=None)
    out = {"f32": best("sgemm_1024_gflops"), "bf16": best("bf16_gemm_1024_gflops"),
           "memcpy_gbytes_per_s": best("memcpy_gbytes_per_s"), "raw": runs}
    out["bf16_is_f32_stand_in"] = out["bf16"] is None
    if out["bf16"] is None:
        out["bf16"] = out["f32"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precisions", default="f32,bf16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps of every row (default: one epoch for mlp/cnn, 200 gpt, 30 gpt-shakespeare)")
    ap.add_argument("--skip", type=int, default=5, help="PyTorch's untimed warm-up steps")
    ap.add_argument("--hpm-first-step", action="store_true",
                    help="count hpm's first step too (by default its rate is over the steps after it)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="PyTorch configurations to try")
    ap.add_argument("--torch2", default=os.environ.get("HPM_TORCH2_VENV") or os.path.join(ROOT, ".peers", "torch2"),
                    help="the PyTorch 2 virtual environment")
    ap.add_argument("--json", default=None, help="also write every row, with every sample, to this file")
    ap.add_argument("--prune", type=float, default=0.0,
                    help="after a row's first repeat, stop running the PyTorch configurations below this "
                         "fraction of that repeat's best (e.g. 0.7; default 0: run all every repeat)")
    a = ap.parse_args()
    global AFTER_FIRST
    if a.hpm_first_step:
        AFTER_FIRST = ""
    models = a.models.split(",")
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m}: pick from {','.join(MODELS)}")
    for c in a.configs.split(","):
        if c not in CONFIGS:
            ap.error(f"unknown configuration {c}: pick from {','.join(CONFIGS)}")
    for p in a.precisions.split(","):
        if p not in ("f32", "bf16"):
            ap.error(f"unknown precision {p}: f32 or bf16")
    if a.steps is not None and a.steps <= a.skip:
        ap.error("--steps must exceed --skip")

    peers.install()
    print(peers.machine(), flush=True)
    versions = {"debian": torch_version(DEBIAN_PYTHON), "venv": torch_version(os.path.join(a.torch2, "bin", "python"))}
    pythons = {"debian": DEBIAN_PYTHON, "venv": os.path.join(a.torch2, "bin", "python")}
    wanted = a.configs.split(",")
    if versions["venv"] is None and any(c.startswith("venv") for c in wanted):
        print(f"note: no PyTorch 2 at {a.torch2} (scripts/setup_peers.sh --torch2 makes it): venv-eager and "
              "venv-compile skipped", flush=True)
    if versions["debian"] is None and any(c.startswith("debian") for c in wanted):
        print(f"note: {DEBIAN_PYTHON} has no torch: the debian configurations skipped", flush=True)
    print(f"PyTorch: debian {versions['debian']}, venv {versions['venv']}; hpm {HPM}; medians of {a.repeats}, "
          f"PyTorch's first {a.skip} steps untimed (1.13 has no torch.compile: compiled runs are 2.x only)", flush=True)
    failures_seen = {}
    rows = []
    start = time.time()
    for threads in [int(t) for t in a.threads.split(",")]:
        pk = peaks(threads)
        mark = " (no bf16 GEMM peak in bench/sgemm_peak: the f32 SGEMM peak stands in)" if pk["bf16_is_f32_stand_in"] else ""
        mem = f", memcpy {pk['memcpy_gbytes_per_s']} GB/s" if pk["memcpy_gbytes_per_s"] else ""
        print(f"\n{threads} thread(s): f32 SGEMM peak {pk['f32']} GFLOP/s, bf16 GEMM peak {pk['bf16']} GFLOP/s{mark}{mem}",
              flush=True)
        for model in models:
            steps = a.steps if a.steps is not None else DEFAULT_STEPS[model]
            if model in GPT_SIZE:
                flops, unit = flops_per_token(SIZES[GPT_SIZE[model]]), "tokens/s"
            else:
                flops, unit = FLOPS_PER_SAMPLE[model], "samples/s"
            for precision in a.precisions.split(","):
                configs = []
                for c in wanted:
                    kind, mode = c.split("-", 1)
                    if versions[kind] is None or (c == "debian-eager-torch" and threads == 1):
                        continue
                    compiled = mode == "compile"
                    configs.append((c, pythons[kind], "torch" if mode == "eager-torch" else "blas", compiled,
                                    f"pytorch-{versions[kind]} {'compile' if compiled else 'eager'}"
                                    + (f" threads-to-{mode.split('-')[1]}" if kind == "debian" and threads > 1 else "")))
                h, t, errors = [], {c[0]: [] for c in configs}, {}
                secs = {c: [] for c in ["hpm"] + [c[0] for c in configs]}
                row_start = time.time()
                pruned = {}
                for rep in range(a.repeats):  # alternating, so drifts in the machine's speed hit every side
                    if rep == 1 and a.prune > 0:
                        firsts = {n: v[0] for n, v in t.items() if v and n not in errors}
                        top = max(firsts.values(), default=0)
                        pruned = {n: v for n, v in firsts.items() if v < a.prune * top}
                    try:
                        t0 = time.time()
                        h.append(hpm(model, threads, precision, steps))
                        secs["hpm"].append(round(time.time() - t0, 1))
                    except RunFailed as e:
                        errors["hpm"] = str(e)
                        break
                    for name, python, mode, compiled, _ in configs:
                        if name in errors or name in pruned:
                            continue  # failed once in this row: not retried; or pruned
                        try:
                            t0 = time.time()
                            t[name].append(torch_run(python, mode, compiled, model, threads, precision, steps, a.skip)[0])
                            secs[name].append(round(time.time() - t0, 1))
                        except (RunFailed, ValueError, KeyError) as e:
                            errors[name] = str(e)
                            if failures_seen.get(name) != str(e):
                                print(f"  {model} {threads}t {precision}: {name} failed ({e}); the row goes on without it",
                                      flush=True)
                            failures_seen[name] = str(e)
                if "hpm" in errors:
                    print(f"  {model} {threads}t {precision}: hpm failed ({errors['hpm']}): row skipped", flush=True)
                    rows.append({"model": model, "threads": threads, "precision": precision, "error": errors["hpm"]})
                    continue
                medians = {n: statistics.median(v) for n, v in t.items() if v and n not in errors}
                mh = statistics.median(h)
                peak = pk[precision]
                row = {"model": model, "threads": threads, "precision": precision, "unit": unit,
                       "steps": steps or "1 epoch", "repeats": a.repeats, "flops_per_unit": flops,
                       "hpm": round(mh, 1), "hpm_samples": h, "hpm_gflops": round(mh * flops / 1e9, 1),
                       "peak_gflops": peak, "peak_is_f32_stand_in": precision == "bf16" and pk["bf16_is_f32_stand_in"],
                       "hpm_fraction_of_peak": round(mh * flops / 1e9 / peak, 3),
                       "torch": {n: {"label": lab, "median": round(medians[n], 1) if n in medians else None,
                                     "samples": t[n], "error": errors.get(n), "pruned": n in pruned}
                                 for n, _, _, _, lab in configs},
                       "run_seconds": secs, "row_seconds": round(time.time() - row_start, 1)}
                if medians:
                    best = max(medians, key=medians.get)
                    mb = medians[best]
                    row.update(best_torch=best, best_torch_label=next(c[4] for c in configs if c[0] == best),
                               best_torch_median=round(mb, 1), ratio=round(mh / mb, 2),
                               torch_gflops=round(mb * flops / 1e9, 1),
                               torch_fraction_of_peak=round(mb * flops / 1e9 / peak, 3))
                rows.append(row)
                others = ", ".join(f"{n} {v:.0f}{' (pruned after 1)' if n in pruned else ''}"
                                   for n, v in sorted(medians.items(), key=lambda kv: -kv[1]))
                if medians:
                    print(f"  {model} {threads}t {precision}: hpm {mh:.0f} {unit} ({row['hpm_fraction_of_peak']:.2f} of peak), "
                          f"best PyTorch {row['best_torch_label']} {row['best_torch_median']:.0f} "
                          f"({row['torch_fraction_of_peak']:.2f} of peak), hpm / best {row['ratio']:.2f}x "
                          f"[{others}] {row['row_seconds']:.0f} s", flush=True)
                else:
                    print(f"  {model} {threads}t {precision}: hpm {mh:.0f} {unit}; no PyTorch configuration ran", flush=True)

    print(f"\n| model | threads | precision | hpm | best PyTorch | configuration | hpm / best | hpm GFLOP/s | "
          f"fraction of peak (hpm / PyTorch) | peak GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['threads']} | {r['precision']} | failed: {r['error']} | | | | | | |")
            continue
        peak = f"{r['peak_gflops']}{' (f32 stand-in)' if r['peak_is_f32_stand_in'] else ''}"
        if "best_torch" in r:
            print(f"| {r['model']} | {r['threads']} | {r['precision']} | {r['hpm']:.0f} {r['unit']} | "
                  f"{r['best_torch_median']:.0f} | {r['best_torch_label']} | {r['ratio']:.2f}x | {r['hpm_gflops']} | "
                  f"{r['hpm_fraction_of_peak']:.2f} / {r['torch_fraction_of_peak']:.2f} | {peak} |")
        else:
            print(f"| {r['model']} | {r['threads']} | {r['precision']} | {r['hpm']:.0f} {r['unit']} | none ran | | | "
                  f"{r['hpm_gflops']} | {r['hpm_fraction_of_peak']:.2f} | {peak} |")
    print(f"\nvs_best_torch: {len(rows)} rows in {time.time() - start:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": peers.machine(), "torch_versions": versions, "repeats": a.repeats, "skip": a.skip,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
