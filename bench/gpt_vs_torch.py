#!/usr/bin/python3
"""hpm's GPT against ../shared/peers/torch_gpt.py, side by side in one run: training tokens/s of
the same model, corpus, optimizer and batch, alternating REPEATS times, medians and their ratio,
and the fraction of this machine's FP32 peak each reaches (FLOPs per token by nanoGPT's estimate
6N + 12 L H Q T, N the parameters without the position embedding; the peak from
build/bench/sgemm_peak in the same run).

usage: bench/gpt_vs_torch.py [--size default|shakespeare] [--threads 1,2] [--steps 200] [--repeats 3]
                            [--precision f32|bf16|both]
  --precision: hpm's ([train] precision; bf16 needs AVX512_BF16). PyTorch runs f32 in every
               case, and with bf16 also under CPU autocast to bf16 (bench/torch_gpt_bf16.py), so
               each hpm precision has a ratio against PyTorch f32 and one against PyTorch in the
               same precision; the peak column stays the f32 SGEMM peak.
  default:     torch_gpt.py's defaults (4 layers, 4 heads, 128 wide, block 64, batch 12)
  shakespeare: nanoGPT's shakespeare_char size (6 layers, 6 heads, 384 wide, block 256, batch 16)
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402

# PyTorch under CPU autocast to bf16: the peer of hpm's bf16 runs.
TORCH_BF16 = os.path.join(ROOT, "bench", "torch_gpt_bf16.py")

SIZES = {"default": dict(layers=4, heads=4, embd=128, block=64, batch=12),
         "shakespeare": dict(layers=6, heads=6, embd=384, block=256, batch=16)}


def flops_per_token(s):
    e, L, t = s["embd"], s["layers"], s["block"]
    params = 256 * e + L * (12 * e * e + 13 * e) + 2 * e  # tied head: no extra matrix
    return 6 * params + 12 * L * s["heads"] * (e // s["heads"]) * t


def hpm(s, threads, steps, precision="f32"):
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        sets = {"model.n_layer": s["layers"], "model.n_head": s["heads"], "model.n_embd": s["embd"],
                "model.block_size": s["block"], "data.batch_size": s["batch"],
                "train.max_steps": steps, "train.eval_every": steps, "train.eval_iters": 1,
                "schedule.t_max": max(1, steps - 100), "schedule.warmup": min(100, steps - 1),
                "train.precision": f'"{precision}"'}
        cmd = [os.path.join(ROOT, "build", "hpm"), "train", os.path.join(ROOT, "examples", "fortunes_gpt.toml"),
               "--threads", str(threads), "--report", rep.name]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.load(open(rep.name))["train_tokens_per_s"]


def torch(s, threads, steps, world=1, script=None):
    """torch_gpt.py's training tokens/s; world > 1: DistributedDataParallel over that many processes.
    `script`: another peer script taking the same arguments (bench/torch_gpt_bf16.py)."""
    out = subprocess.run(["/usr/bin/python3", script or os.path.join(peers.PEERS, "torch_gpt.py"), "--timing-only",
                          "--iters", str(steps), "--threads", str(threads), "--world", str(world)] +
                         sum([[f"--{k}", str(v)] for k, v in s.items()], []),
                         env=peers.env("blas"), check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["train_tokens_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="default", choices=SIZES)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16", "both"])
    a = ap.parse_args()
    peers.install()
    print(peers.machine(), flush=True)
    s = SIZES[a.size]
    fpt = flops_per_token(s)
    print(f"size {a.size} {s}, {fpt / 1e6:.1f} MFLOP per token, {a.steps} steps, medians of {a.repeats}")
    precisions = ["f32", "bf16"] if a.precision == "both" else [a.precision]
    print("| threads | precision | hpm tokens/s | PyTorch f32 tokens/s | hpm / PyTorch f32 | "
          "PyTorch in this precision | hpm / PyTorch in this precision | hpm GFLOP/s | PyTorch f32 GFLOP/s | "
          "f32 SGEMM peak | hpm fraction of it |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for threads in [int(t) for t in a.threads.split(",")]:
        peak = peers.sgemm_peak(ROOT, threads)
        h = {p: [] for p in precisions}
        t = {p: [] for p in ["f32"] + precisions}
        for _ in range(a.repeats):  # alternating, so drifts in the machine's speed hit both
            for p in precisions:
                h[p].append(hpm(s, threads, a.steps, p))
            for p in t:
                t[p].append(torch(s, threads, a.steps, script=TORCH_BF16 if p == "bf16" else None))
        mt = {p: statistics.median(v) for p, v in t.items()}
        for p in precisions:
            mh = statistics.median(h[p])
            print(f"| {threads} | {p} | {mh:.0f} | {mt['f32']:.0f} | {mh / mt['f32']:.2f}x | {mt[p]:.0f} | "
                  f"{mh / mt[p]:.2f}x | {mh * fpt / 1e9:.1f} | {mt['f32'] * fpt / 1e9:.1f} | {peak:.1f} | "
                  f"{mh * fpt / 1e9 / peak:.2f} |", flush=True)


if __name__ == "__main__":
    main()
