#!/usr/bin/python3
"""Two builds of hpm side by side: `hpm train` of the same example configs from binary A and
binary B, alternating, REPEATS times each, and the medians' ratio B / A of training samples/s
(tokens/s for the GPTs). For "no speed regression" claims: build the older commit into its own
directory and compare.

usage: bench/ab_train.py A/hpm B/hpm [--models mlp,cnn,gpt,gpt_bf16] [--threads 1] [--repeats 5]
       [--steps 30] [--set section.key=value ...]
  mlp, cnn:      examples/fashion_{mlp,cnn}.toml, one epoch
  gpt, gpt_bf16: examples/fortunes_gpt.toml at nanoGPT's shakespeare_char size (6 layers, 6
                 heads, 384 wide, block 256, batch 16: 10.8M parameters), STEPS steps, f32 / bf16
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402


GPT = {"model.n_layer": 6, "model.n_head": 6, "model.n_embd": 384, "model.block_size": 256,
       "data.batch_size": 16}


def gpt_tokens_per_s(hpm, precision, threads, steps, extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        sets = dict(GPT, **{"train.max_steps": steps, "train.eval_every": steps,
                            "train.eval_iters": 1, "schedule.t_max": steps,
                            "schedule.warmup": 1, "train.precision": f'"{precision}"'})
        cmd = [hpm, "train", os.path.join(ROOT, "examples", "fortunes_gpt.toml"),
               "--threads", str(threads), "--report", rep.name]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        for s in extra:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.load(open(rep.name))["train_tokens_per_s"]


def samples_per_s(hpm, model, threads, extra, steps=30):
    if model in ("gpt", "gpt_bf16"):
        return gpt_tokens_per_s(hpm, "bf16" if model == "gpt_bf16" else "f32", threads, steps,
                                extra)
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        cmd = [hpm, "train", os.path.join(ROOT, "examples", f"fashion_{model}.toml"),
               "--set", "train.epochs=1", "--threads", str(threads), "--report", rep.name]
        for s in extra:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.load(open(rep.name))["train_samples_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    print(peers.machine(), flush=True)
    print("| model | A samples/s (tokens/s for a GPT) | B | B / A |")
    print("|---|---|---|---|")
    for model in args.models.split(","):
        a, b = [], []
        for _ in range(args.repeats):
            a.append(samples_per_s(args.a, model, args.threads, args.set, args.steps))
            b.append(samples_per_s(args.b, model, args.threads, args.set, args.steps))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {model} | {ma:.0f} | {mb:.0f} | {mb / ma:.3f} |", flush=True)


if __name__ == "__main__":
    main()
