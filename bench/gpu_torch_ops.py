#!/usr/bin/env python3
"""PyTorch 2's time for each op of a GPT training step on the GPU, per step (one op's median time
times its calls a step), to set beside `hpm train --op-profile`'s table of the same step (the
op profile's rows: linear, matmul, linear_param_grads, packed_attention_*, layer_norm_*, gelu,
cross_entropy_*, adam). It says which of hpm's ops lag what the card does for the same shapes
under PyTorch eager (cuBLASLt, flash SDPA, fused AdamW), so that the work goes where the gap is.
Runs on the GPU machine (scripts/gpu_check.sh); bf16 products and attention as under autocast,
layer norm on the f32 residual stream as hpm keeps it.

usage: gpu_torch_ops.py [--sizes gpt2,shakespeare] [--iters 20]
"""
import argparse

import torch
import torch.nn.functional as F

SIZES = {  # bench/gpu_gpt.py's
    "shakespeare": dict(layers=6, heads=6, embd=384, block=256, batch=64, vocab=256),
    "gpt2": dict(layers=12, heads=12, embd=768, block=1024, batch=16, vocab=50304),
}


def timed(fn, iters):
    """Median milliseconds of fn() over iters calls after three warm-up calls, each between two
    CUDA events."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def ops(s):
    """(name, calls a step, flops a call or 0, fn) for one size's step."""
    dev, bf = "cuda", torch.bfloat16
    rows, c, h = s["batch"] * s["block"], s["embd"], s["heads"]
    rnd = lambda *shape, dtype=bf: torch.randn(*shape, device=dev, dtype=dtype)
    out = []
    # The products: forward (linear), the input's gradient (matmul), the weight's (param grads).
    for name, k, n, bias in (("qkv", c, 3 * c, True), ("attn_proj", c, c, True),
                             ("fc", c, 4 * c, True), ("fc_proj", 4 * c, c, True),
                             ("classifier", c, s["vocab"], False)):
        x, w, dy = rnd(rows, k), rnd(n, k), rnd(rows, n)
        b = rnd(n) if bias else None
        calls = 1 if name == "classifier" else s["layers"]
        fl = 2 * rows * k * n
        # Each named with its M x N x K as hpm's op profile names its products' rows.
        out.append((f"linear {name} {rows}x{n}x{k}", calls, fl,
                    lambda x=x, w=w, b=b: F.linear(x, w, b)))
        out.append((f"matmul dx {name} {rows}x{k}x{n}", calls, fl, lambda dy=dy, w=w: dy @ w))
        out.append((f"param grad {name} {n}x{k}x{rows}", calls, fl,
                    lambda dy=dy, x=x, b=b: (dy.t() @ x, dy.sum(0) if b is not None else None)))
    q, k_, v = (rnd(s["batch"], h, s["block"], c // h).requires_grad_() for _ in range(3))
    t = s["block"]
    attn_fl = 4 * s["batch"] * h * t * t * (c // h) // 2  # causal: half the square
    out.append(("attention fwd", s["layers"], attn_fl,
                lambda: F.scaled_dot_product_attention(q, k_, v, is_causal=True)))
    o = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
    do = torch.randn_like(o)
    out.append(("attention bwd", s["layers"], 5 * attn_fl // 2,
                lambda: torch.autograd.grad(o, (q, k_, v), do, retain_graph=True)))
    xr = rnd(rows, c, dtype=torch.float32).requires_grad_()
    lw, lb = rnd(c, dtype=torch.float32).requires_grad_(), rnd(c, dtype=torch.float32).requires_grad_()
    out.append(("layer_norm fwd", 2 * s["layers"] + 1, 0, lambda: F.layer_norm(xr, (c,), lw, lb)))
    y = F.layer_norm(xr, (c,), lw, lb)
    dy = torch.randn_like(y)
    out.append(("layer_norm bwd", 2 * s["layers"] + 1, 0,
                lambda: torch.autograd.grad(y, (xr, lw, lb), dy, retain_graph=True)))
    g = rnd(rows, 4 * c).requires_grad_()
    out.append(("gelu fwd", s["layers"], 0, lambda: F.gelu(g)))
    gy = F.gelu(g)
    gdy = torch.randn_like(gy)
    out.append(("gelu bwd", s["layers"], 0,
                lambda: torch.autograd.grad(gy, g, gdy, retain_graph=True)))
    logits = rnd(rows, s["vocab"]).requires_grad_()
    tgt = torch.randint(0, s["vocab"], (rows,), device=dev)
    out.append(("cross_entropy fwd", 1, 0, lambda: F.cross_entropy(logits.float(), tgt)))
    loss = F.cross_entropy(logits.float(), tgt)
    out.append(("cross_entropy bwd", 1, 0,
                lambda: torch.autograd.grad(loss, logits, retain_graph=True)))
    params = 12 * c * c * s["layers"] + s["vocab"] * c + s["block"] * c
    p = torch.nn.Parameter(torch.randn(params, device=dev))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
    out.append(("adamw fused", 1, 0, opt.step))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="gpt2,shakespeare")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for size in args.sizes.split(","):
        s = SIZES[size]
        print(f"\n{size}: PyTorch eager's time an op, and a step's worth (calls a step x median)")
        print(f"{'op':40} {'calls':>5} {'ms/call':>9} {'ms/step':>9} {'TFLOP/s':>8}")
        total = 0.0
        for name, calls, fl, fn in ops(s):
            ms = timed(fn, args.iters)
            total += calls * ms
            rate = f"{fl / ms / 1e9:8.0f}" if fl else f"{'':8}"
            print(f"{name:40} {calls:5d} {ms:9.4f} {calls * ms:9.3f} {rate}", flush=True)
        print(f"{'sum':40} {'':5} {'':9} {total:9.3f}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
