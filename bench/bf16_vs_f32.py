#!/usr/bin/python3
"""hpm's training step in bf16 mixed precision against hpm in f32, side by side in one run:
throughput (medians of REPEATS alternating runs) and the peak bytes of a step (Device accounting,
the report's step_peak_bytes: parameters, gradients, optimizer state and activations), each with
its ratio bf16 / f32.

usage: bench/bf16_vs_f32.py [--models gpt,gpt-shakespeare,cnn] [--threads 1,2] [--repeats 3]
  gpt:             examples/fortunes_gpt.toml, 200 steps
  gpt-shakespeare: the same at nanoGPT's shakespeare_char size (10.8M parameters), 30 steps
  cnn:             examples/fashion_cnn.toml, one epoch
Needs build/ (scripts/setup.sh) and a CPU with AVX512_BF16 (hpm refuses bf16 elsewhere).
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402


def gpt_sets(layers, heads, embd, block, batch, steps):
    return {"model.n_layer": layers, "model.n_head": heads, "model.n_embd": embd,
            "model.block_size": block, "data.batch_size": batch, "train.max_steps": steps,
            "train.eval_every": steps, "train.eval_iters": 1, "schedule.t_max": max(1, steps - 100),
            "schedule.warmup": min(100, steps - 1)}


MODELS = {
    "gpt": ("fortunes_gpt.toml", gpt_sets(4, 4, 128, 64, 12, 200), "train_tokens_per_s", "tokens/s"),
    "gpt-shakespeare": ("fortunes_gpt.toml", gpt_sets(6, 6, 384, 256, 16, 30), "train_tokens_per_s",
                        "tokens/s"),
    "cnn": ("fashion_cnn.toml", {"train.epochs": 1}, "train_samples_per_s", "samples/s"),
}


def run(model, precision, threads):
    config, sets, key, _ = MODELS[model]
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        cmd = [os.path.join(ROOT, "build", "hpm"), "train", os.path.join(ROOT, "examples", config),
               "--threads", str(threads), "--report", rep.name, "--set", f"train.precision={precision}"]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        r = json.load(open(rep.name))
        return r[key], r["step_peak_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt,gpt-shakespeare,cnn")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    print(peers.machine(), flush=True)
    print("| model | threads | f32 | bf16 | bf16 / f32 | f32 step peak MiB | bf16 step peak MiB | bf16 / f32 |")
    print("|---|---|---|---|---|---|---|---|")
    for threads in [int(t) for t in a.threads.split(",")]:
        for model in a.models.split(","):
            speed = {"f32": [], "bf16": []}
            peak = {}
            for _ in range(a.repeats):  # alternating, so drifts in the machine's speed hit both
                for p in speed:
                    s, b = run(model, p, threads)
                    speed[p].append(s)
                    peak[p] = b
            f, h = statistics.median(speed["f32"]), statistics.median(speed["bf16"])
            unit = MODELS[model][3]
            print(f"| {model} | {threads} | {f:.0f} {unit} | {h:.0f} {unit} | {h / f:.2f}x | "
                  f"{peak['f32'] / 2**20:.1f} | {peak['bf16'] / 2**20:.1f} | {peak['bf16'] / peak['f32']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
