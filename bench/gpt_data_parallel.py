#!/usr/bin/python3
"""A GPT's training spread over this machine's 2 cores, side by side in one run (issue 18): hpm's
one device with 1 and with 2 kernel threads, Mirrored with 2 replicas (threads of one process),
MultiWorkerMirrored with 2 processes of 1 thread over gloo (f32; gradients as bf16 messages; bf16
mixed precision, with f32 or bf16 messages), a 2-stage pipeline (8 micro-batches, the balanced
cut, 1F1B and interleaved 1F1B with 2 chunks per stage; stages as threads, and as 2 processes), PyTorch DDP (2 processes,
gloo, ../shared/peers/torch_gpt.py --world 2) and PyTorch alone (1 thread), both also under CPU
autocast to bf16 (bench/torch_gpt_bf16.py), on the same model,
corpus, optimizer and global batch. Tokens/s of training alone (one tiny evaluation at the end is
outside the timing), alternating REPEATS times, medians and the ratios the issue asks for.

usage: bench/gpt_data_parallel.py [--size shakespeare|default] [--steps 30] [--repeats 3]
          [--only one_device_1,one_device_2,mirrored,multi_worker,multi_worker_bf16,
                  multi_worker_mixed,multi_worker_mixed_bf16,pipeline,pipeline_processes,
                  pipeline_interleaved,pipeline_interleaved_processes,torch_ddp,torch_1,
                  torch_ddp_bf16,torch_1_bf16]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402
from gpt_vs_torch import SIZES, TORCH_BF16, torch  # noqa: E402

HPM = os.path.join(ROOT, "build", "hpm")
PIPELINE = {"pipeline.stages": 2, "pipeline.micro_batches": 8, "pipeline.schedule": '"1f1b"',
            "pipeline.partition": '"balanced"'}
# Megatron's interleaved 1F1B: each stage holds 2 chunks of the cut, which halves the bubble of
# 1F1B at M = 8 (1/9 of the step) for twice the hand-offs.
INTERLEAVED = dict(PIPELINE, **{"pipeline.schedule": '"interleaved"', "pipeline.chunks_per_stage": 2})


def hpm_args(s, steps, threads, extra):
    sets = {"model.n_layer": s["layers"], "model.n_head": s["heads"], "model.n_embd": s["embd"],
            "model.block_size": s["block"], "data.batch_size": s["batch"],
            "train.max_steps": steps, "train.eval_every": steps, "train.eval_iters": 1,
            "schedule.t_max": max(1, steps - 1), "schedule.warmup": 1}
    sets.update(extra)
    cmd = ["train", os.path.join(ROOT, "examples", "fortunes_gpt.toml"), "--threads", str(threads)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def hpm(s, steps, threads, extra=None, world=1):
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "r.json")
        cmd = [HPM] + hpm_args(s, steps, threads, extra or {})
        if world == 1:
            subprocess.run(cmd + ["--report", report], check=True, capture_output=True, text=True)
        else:
            rdv = os.path.join(d, "rdv")
            os.makedirs(rdv)
            cmd += ["--world-size", str(world), "--rendezvous", rdv]
            others = [subprocess.Popen(cmd + ["--rank", str(r)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL) for r in range(1, world)]
            subprocess.run(cmd + ["--rank", "0", "--report", report], check=True, capture_output=True,
                           text=True)
            if any(p.wait() != 0 for p in others):
                raise RuntimeError("a worker failed")
        return json.load(open(report))["train_tokens_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="shakespeare", choices=SIZES)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    peers.install()
    print(peers.machine(), flush=True)
    s = SIZES[a.size]
    runs = {
        "one_device_1": lambda: hpm(s, a.steps, 1),
        "one_device_2": lambda: hpm(s, a.steps, 2),
        "mirrored": lambda: hpm(s, a.steps, 2, {"strategy.kind": '"mirrored"', "strategy.replicas": 2}),
        "multi_worker": lambda: hpm(s, a.steps, 1, {"strategy.kind": '"multi_worker_mirrored"'}, world=2),
        # Gradient buckets as bf16 messages over gloo: half the bytes.
        "multi_worker_bf16": lambda: hpm(s, a.steps, 1, {"strategy.kind": '"multi_worker_mirrored"',
                                                         "strategy.allreduce_dtype": '"bf16"'},
                                         world=2),
        # Mixed precision (bf16 products, f32 master weights and gradients all-reduced in f32):
        # the same model, optimizer and data as the f32 runs.
        "multi_worker_mixed": lambda: hpm(s, a.steps, 1, {"strategy.kind": '"multi_worker_mirrored"',
                                                          "train.precision": '"bf16"'}, world=2),
        "multi_worker_mixed_bf16": lambda: hpm(s, a.steps, 1, {
            "strategy.kind": '"multi_worker_mirrored"', "train.precision": '"bf16"',
            "strategy.allreduce_dtype": '"bf16"'}, world=2),
        "pipeline": lambda: hpm(s, a.steps, 2, PIPELINE),
        "pipeline_processes": lambda: hpm(s, a.steps, 1, PIPELINE, world=2),
        "pipeline_interleaved": lambda: hpm(s, a.steps, 2, INTERLEAVED),
        "pipeline_interleaved_processes": lambda: hpm(s, a.steps, 1, INTERLEAVED, world=2),
        "torch_ddp": lambda: torch(s, 1, a.steps, world=2),
        "torch_1": lambda: torch(s, 1, a.steps),
        # PyTorch under CPU autocast to bf16 (bench/torch_gpt_bf16.py), the peer of hpm's bf16 runs.
        "torch_ddp_bf16": lambda: torch(s, 1, a.steps, world=2, script=TORCH_BF16),
        "torch_1_bf16": lambda: torch(s, 1, a.steps, script=TORCH_BF16),
    }
    chosen = [k for k in runs if not a.only or k in a.only.split(",")]
    print(f"size {a.size} {s}, {a.steps} steps, medians of {a.repeats} (alternating)", flush=True)
    got = {k: [] for k in chosen}
    for _ in range(a.repeats):
        for k in chosen:
            got[k].append(runs[k]())
            print(f"  {k}: {got[k][-1]:.0f} tokens/s", flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print("| run | tokens/s (median) |\n|---|---|")
    for k in chosen:
        print(f"| {k} | {med[k]:.0f} |")
    targets = [("mirrored", "one_device_2", 0.95), ("mirrored", "one_device_1", 1.8),
               ("multi_worker", "one_device_2", 0.9), ("multi_worker", "torch_ddp", 2.0),
               ("pipeline", "one_device_1", 1.7), ("pipeline_processes", "one_device_1", 1.7),
               ("pipeline_interleaved", "one_device_1", 1.7),
               ("pipeline_interleaved_processes", "one_device_1", 1.7),
               ("one_device_1", "torch_1", 1.25), ("multi_worker_bf16", "multi_worker", None),
               ("multi_worker_mixed", "torch_ddp", 2.0), ("multi_worker_mixed", "multi_worker", None),
               ("multi_worker_mixed_bf16", "torch_ddp", 2.0), ("torch_ddp_bf16", "torch_ddp", None),
               ("torch_1_bf16", "torch_1", None), ("multi_worker_mixed", "torch_ddp_bf16", 2.0),
               ("multi_worker_mixed_bf16", "torch_ddp_bf16", 2.0)]
    print("| ratio | measured | target |\n|---|---|---|")
    for num, den, target in targets:
        if num in med and den in med:
            print(f"| {num} / {den} | {med[num] / med[den]:.2f}x | "
                  f"{'-' if target is None else str(target) + 'x'} |")


if __name__ == "__main__":
    main()
