#!/usr/bin/env python3
"""hpm's GPT on one GPU against PyTorch 2 on the same card, in one call: tokens/s, the ratio to
PyTorch eager and to torch.compile, the model FLOPs utilization against the card's bf16 GEMM rate
measured in the same call (a large product on random data through torch.matmul, i.e. cuBLASLt),
and peak device memory for both; with --repeats N, the median of N runs of each side. Runs on
the GPU machine (scripts/gpu_check.sh calls it with the bundle's hpm).

usage: gpu_gpt.py --hpm PATH --peer torch_gpt.py --text FILE... [--sizes fortunes,shakespeare,gpt2]
                  [--steps 200] [--precision bf16] [--repeats N] [--json OUT]

Sizes (issue 32): fortunes = 4 layers, 4 heads, 128 wide, block 64, batch 12 (the default GPT);
shakespeare = nanoGPT's shakespeare model, 6/6/384, block 256, batch 64; gpt2 = GPT-2 small,
12/12/768, block 1024, batch 16, vocabulary 50304 on random tokens (timing only: hpm's
[data] source = "random_tokens", the peer's --random-tokens). Byte-level sizes train on the --text
files.

Both sides exclude warm-up: the peer times from a synchronize after its first 10 steps; hpm's
rate is its report's train_tokens_per_s_after_first_step (the first step makes the kernels'
plans and the allocator's pool). Each side synchronizes at its ends.

--ab-env KEY=VALUE runs hpm again with that environment variable (for example
HPM_CUDA_ATTENTION=wmma, the WMMA attention kernels instead of the register-tiled mma.sync ones,
HPM_CUDA_ATTENTION=mma16, those with one 16-row query tile a warp in the forward instead of two,
HPM_CUDA_ATTENTION=rowwise, the attention kernels before the tensor-core ones, or
HPM_CUDA_LT_EPILOGUES=0, the products without cuBLASLt's bias epilogues, HPM_CUDA_LT_BIAS_GRAD=0,
without its bias-gradient epilogue only, HPM_CUDA_UNARY_PAIRS=0, the activations' kernels with one
8-element group a thread instead of two, HPM_FUSED_CROSS_ENTROPY=0, the loss's forward and backward
passes over the logits apart instead of the gradient written in the forward, HPM_LOSS_READ_AFTER_UPDATE=0,
the step's loss read at its backward's end instead of after its update is issued,
HPM_CUDA_LT_AUTOTUNE=1, every product's algorithm chosen by timing cuBLASLt's first eight at the
shape's first call instead of taking its first, HPM_CUDA_ATTENTION_CUDNN=1, the attention on
cuDNN's fused flash attention instead of hpm's kernels; hpm's "hpm: cuBLASLt" and "hpm: cuDNN
attention" lines are printed too) and prints its rate beside the first; repeatable, one run per
variable, for every size or those of --ab-sizes. KEY=VALUE,KEY2=VALUE2 sets several in one run.
Each A/B line gives the first run's rate over the variant's, then the variant's over PyTorch eager's
and torch.compile's.

Where hpm fails on a size (an error, not a timeout), it runs once more with every new path off
(FALLBACK below: the plain cuBLAS products, the unfused bf16 compositions, the warp-per-row
attention, the loss read before the update, the norms' bf16 gradient copies) and the table marks
that row's figures with '*': one device call still brings back a rate, and the log says which path
failed.

--profile-steps N (N > 1) runs hpm once more per size for N steps with --op-profile and prints each
table last: the step's time by op on the device (every step but the first; hpm train --op-profile).
"""
import argparse, json, os, subprocess, sys, tempfile, time

SIZES = {
    "fortunes": dict(layers=4, heads=4, embd=128, block=64, batch=12, vocab=256),
    "shakespeare": dict(layers=6, heads=6, embd=384, block=256, batch=64, vocab=256),
    "gpt2": dict(layers=12, heads=12, embd=768, block=1024, batch=16, vocab=50304, max_steps=40),
}


# The paths hpm had before issue 32's unmeasured work, each behind its own switch.
FALLBACK = {"HPM_CUDA_LT_EPILOGUES": "0", "HPM_BF16_FUSIONS": "0", "HPM_CUDA_ATTENTION": "rowwise",
            "HPM_LOSS_READ_AFTER_UPDATE": "0", "HPM_BF16_GRADIENT_COPIES": "0"}


def run(cmd, timeout, env=None):
    """subprocess.run that reports a timeout as a result, so that one size's hang leaves the rest
    of the table."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None


def steps_for(args, size):
    """--steps, capped per size: GPT-2 small's 16k-token steps take long enough that 40 give a
    steady rate, and 100 could pass a run's timeout on a slow build."""
    return min(args.steps, SIZES[size].get("max_steps", args.steps))


def gemm_rate_tflops():
    import torch
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    reps = 10
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def run_peer(args, size, compile_):
    s = SIZES[size]
    cmd = [sys.executable, args.peer, "--device", "cuda", "--precision", args.precision,
           "--layers", str(s["layers"]), "--heads", str(s["heads"]), "--embd", str(s["embd"]),
           "--block", str(s["block"]), "--batch", str(s["batch"]),
           "--iters", str(steps_for(args, size)),
           "--timing-only"]
    if s["vocab"] != 256:
        cmd += ["--vocab", str(s["vocab"]), "--random-tokens"]
    else:
        cmd += ["--text"] + args.text
    if compile_:
        cmd.append("--compile")
    out = run(cmd, args.timeout)
    if out is None:
        return {"error": f"timed out after {args.timeout} s", "timeout": True}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr or out.stdout)[-400:]}
    return json.loads(lines[-1])


def run_hpm(args, size, env=None, profile_steps=0):
    s = SIZES[size]
    steps = profile_steps or steps_for(args, size)
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        sets = {"model.n_layer": s["layers"], "model.n_head": s["heads"], "model.n_embd": s["embd"],
                "model.block_size": s["block"], "data.batch_size": s["batch"],
                "train.max_steps": steps, "train.eval_every": steps,
                "train.eval_iters": 1, "train.precision": args.precision,
                "schedule.t_max": steps, "schedule.warmup": min(10, steps)}
        cmd = [args.hpm, "train", args.config, "--device", "cuda", "--report", report]
        profile = os.path.join(tmp, "ops.txt")
        if profile_steps:
            cmd += ["--op-profile", profile]
        if s["vocab"] != 256:
            sets["data.source"] = '"random_tokens"'
            sets["model.vocab_size"] = s["vocab"]
        else:
            cmd += ["--set", "data.files=" + args.text_glob]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        out = run(cmd, args.timeout, env={**os.environ, **(env or {})})
        if out is None:
            return {"error": f"timed out after {args.timeout} s", "timeout": True}
        if out.returncode != 0 or not os.path.exists(report):
            return {"error": (out.stderr or out.stdout)[-400:]}
        # hpm's one-time notes (a cuBLASLt epilogue with no algorithm on this card, say): what ran
        # instead of what was meant to.
        for note in sorted({l for l in out.stderr.splitlines()
                            if l.startswith(("hpm: cuBLASLt", "hpm: cuDNN attention"))}):
            print(f"{size} {' '.join(f'{k}={v}' for k, v in (env or {}).items())}: {note}",
                  flush=True)
        if profile_steps:
            with open(profile) as f:
                return {"profile": f.read()}
        with open(report) as f:
            return json.load(f)


def hpm_rate(h):
    return h.get("train_tokens_per_s_after_first_step") or h.get("train_tokens_per_s")


def peer_rate(e):
    return e.get("train_tokens_per_s")


def median_run(runs, rate):
    """The run whose rate is the median of those that gave one (of an even count, the lower
    middle), with every run's rate beside it; the last run (its error) when none did."""
    ok = sorted((r for r in runs if rate(r)), key=rate)
    if not ok:
        return runs[-1] if runs else {}
    return {**ok[(len(ok) - 1) // 2], "rates": [rate(r) for r in runs]}


def flops_per_token(size, h):
    """nanoGPT's estimate (the peer's figure): 6 flops a parameter but the position embedding's,
    and 12 L H Q T for attention; from hpm's report where no peer ran."""
    s = SIZES[size]
    if not h.get("parameters"):
        return None
    return 6 * (h["parameters"] - s["block"] * s["embd"]) + 12 * s["layers"] * s["embd"] * s["block"]


def print_row(r, peak):
    """One size's line of the table: rates, ratios, MFU against the card's measured bf16 GEMM
    rate, peak memory."""
    h, e, c = r["hpm"], r["eager"], r["compile"]
    ht = hpm_rate(h)
    et, ct = peer_rate(e), peer_rate(c)
    fpt = e.get("flops_per_token") or c.get("flops_per_token") or flops_per_token(r["size"], h)
    fmt = lambda v, spec: format(v, spec) if v is not None else "n/a"
    ratio = lambda a, b: a / b if a and b else None
    mfu = lambda t: t * fpt / (peak * 1e12) if t and fpt else None
    hm = h.get("device_peak_bytes")
    tm = e.get("peak_memory_bytes")
    name = r["size"] + ("*" if h.get("fallback") else "")
    print(f"{name:12} {fmt(ht, '11.0f')} {fmt(et, '11.0f')} {fmt(ct, '11.0f')} "
          f"{fmt(ratio(ht, et), '7.2f')} {fmt(ratio(ht, ct), '8.2f')} {fmt(mfu(ht), '8.1%')} "
          f"{fmt(mfu(ct), '8.1%')} {fmt(hm and hm / 2**20, '8.0f')} {fmt(tm and tm / 2**20, '9.0f')}",
          flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hpm", required=True)
    p.add_argument("--peer", required=True)
    p.add_argument("--text", nargs="+", required=True)
    p.add_argument("--config", default="examples/fortunes_gpt.toml")
    p.add_argument("--sizes", default="fortunes,shakespeare,gpt2")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--precision", default="bf16", choices=["f32", "bf16"])
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--json", default="")
    p.add_argument("--ab-env", action="append", default=[],
                   help="KEY=VALUE: hpm again under this variable (repeatable: one run each)")
    p.add_argument("--repeats", type=int, default=1,
                   help="N: hpm, eager and torch.compile each run N times, interleaved; the "
                        "median of each is reported (run 7 and run 6 saw torch.compile's rate "
                        "move 30%% between calls)")
    p.add_argument("--hpm-only", action="store_true",
                   help="no peer runs (a quick profile of hpm alone: its rates, A/Bs, op tables)")
    p.add_argument("--ab-sizes", default="",
                   help="the sizes the --ab-env runs are made for (comma-separated; all if empty)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="N > 1: hpm once more for N steps with --op-profile; tables printed last")
    args = p.parse_args()
    abs_ = [(spec, dict(kv.split("=", 1) for kv in spec.split(","))) for spec in args.ab_env]
    args.text_glob = os.path.join(os.path.dirname(args.text[0]), "*")
    peak = gemm_rate_tflops()
    print(f"bf16 GEMM 8192^3 on this card: {peak:.0f} TFLOP/s", flush=True)
    print(f"\n{'size':12} {'hpm tok/s':>11} {'eager':>11} {'compile':>11} {'/eager':>7} "
          f"{'/compile':>8} {'MFU hpm':>8} {'MFU comp':>8} {'hpm MiB':>8} {'torch MiB':>9}",
          flush=True)
    rows = []
    # Each size's row as soon as it is measured: a call cut short keeps the rows it finished.
    for size in args.sizes.split(","):
        runs = {"hpm": [], "eager": [], "compile": []}
        for _ in range(max(1, args.repeats)):  # interleaved: a drift of the card's clocks is shared
            runs["hpm"].append(run_hpm(args, size))
            if not args.hpm_only:
                runs["eager"].append(run_peer(args, size, False))
                runs["compile"].append(run_peer(args, size, True))
        r = {"size": size, "hpm": median_run(runs["hpm"], hpm_rate),
             "eager": median_run(runs["eager"], peer_rate),
             "compile": median_run(runs["compile"], peer_rate)}
        if "error" in r["hpm"] and not r["hpm"].get("timeout"):
            print(f"hpm failed on {size}: {r['hpm']['error']}\nagain with {FALLBACK}", flush=True)
            r["hpm_failed"] = r["hpm"]
            r["hpm"] = {**run_hpm(args, size, FALLBACK), "fallback": True}
        print_row(r, peak)
        if args.repeats > 1:  # the spread the medians came from
            print("   runs: " + "; ".join(
                f"{k} " + " ".join(f"{v:.0f}" if v else "n/a" for v in r[k].get("rates", []))
                for k in ("hpm", "eager", "compile")), flush=True)
        for spec, env in abs_:
            if not args.ab_sizes or size in args.ab_sizes.split(","):
                r["hpm_ab " + spec] = run_hpm(args, size, env)
        if args.profile_steps > 1:
            r["hpm_profile"] = run_hpm(args, size, profile_steps=args.profile_steps)
        rows.append(r)
    if any(r["hpm"].get("fallback") for r in rows):
        print("* hpm failed on this size and ran again with " +
              " ".join(f"{k}={v}" for k, v in FALLBACK.items()))
    for spec, _ in abs_:
        print(f"\nhpm with {spec}:")
        for r in rows:
            a, b = hpm_rate(r["hpm"]), hpm_rate(r.get("hpm_ab " + spec, {}))
            # The variant against the peers too: what the bars would read were it the default.
            e, c = peer_rate(r["eager"]), peer_rate(r["compile"])
            bars = "".join(f", {b / p:.2f}x {name}" for name, p in (("eager", e), ("compile", c))
                           if b and p)
            print(f"{r['size']:12} {b and round(b) or 'n/a':>11} tokens/s against {a and round(a) or 'n/a'}"
                  f" ({a / b:.2f}x{bars})" if a and b else f"{r['size']:12} n/a")
    for r in rows:
        if "hpm_profile" in r:
            prof = r["hpm_profile"]
            print(f"\nop profile, {r['size']}, {args.precision}, steps 2..{args.profile_steps}:")
            print(prof.get("profile") or prof.get("error"))
            products = product_rates(prof.get("profile") or "")
            if products:
                print(f"hpm's products by shape (M x N x K), {r['size']}: TFLOP/s")
                for line in products:
                    print(line)
    for r in rows:  # every run's figures, last (the summary takes the table above)
        print(json.dumps({k: v for k, v in r.items() if k != "hpm_profile"})[:2000], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gemm_tflops": peak, "precision": args.precision, "steps": args.steps,
                       "rows": rows}, f, indent=1)


def product_rates(profile):
    """Lines of TFLOP/s for the op profile's product rows (hpm names each shape M x N x K: matmul,
    linear, linear_param_grads_), 2 M N K flops a call, to set beside gpu_torch_ops.py's."""
    out = []
    for line in profile.splitlines():
        parts = line.split()
        if len(parts) < 7 or parts[0] not in ("matmul", "linear", "linear_param_grads_"):
            continue
        dims = parts[1].split("x")
        if len(dims) != 3 or not all(d.isdigit() for d in dims):
            continue
        try:
            ms, calls = float(parts[4]), float(parts[6])
        except ValueError:
            continue
        m, n, k = (int(d) for d in dims)
        if ms > 0 and calls > 0:
            rate = 2 * m * n * k * calls / (ms * 1e-3) / 1e12
            out.append(f"  {parts[0]:20} {parts[1]:18} {calls:5.1f} calls {ms / calls:8.4f} ms/call"
                       f" {rate:7.1f} TFLOP/s")
    return out


if __name__ == "__main__":
    main()
