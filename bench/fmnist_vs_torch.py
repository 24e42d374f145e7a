#!/usr/bin/python3
"""hpm against PyTorch on Fashion-MNIST, side by side in one run.

For each model (mlp, cnn) and thread count, runs `hpm train` and ../shared/peers/torch_fmnist.py
on the same model, batch 64, one epoch, alternating REPEATS times, and prints the median training
samples/s of each and their ratio. PyTorch "at its best" is the peer script as its README says:
OpenBLAS told its core, and at 2 threads the better of the threads given to OpenBLAS
(PEER_THREADS_TO=blas) or to PyTorch's own pool (PEER_THREADS_TO=torch), whose medians are both
printed; "default" is an untuned install (PEER_DEFAULT=1). Also prints hpm's training FLOP rate as
a fraction of this machine's practical FP32 peak (a large oneDNN SGEMM, bench/sgemm_peak) and the
CPU it ran on.

usage: bench/fmnist_vs_torch.py [--models mlp,cnn] [--threads 1,2] [--repeats 3]
Needs: build/ (scripts/setup.sh); installs the peers itself (scripts/setup_peers.sh).
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402

PEER = os.path.join(peers.PEERS, "torch_fmnist.py")
# Training FLOPs per example: forward, weight gradients, and input gradients of every layer but
# the first (whose input needs none).
FLOPS_PER_SAMPLE = {
    "mlp": 2 * (784 * 512 + 512 * 256 + 256 * 10) * 2 + 2 * (512 * 256 + 256 * 10),
    "cnn": (2 * 28 * 28 * 32 * 9 + 2 * 14 * 14 * 64 * 32 * 9 + 2 * 3136 * 128 + 2 * 128 * 10) * 2
           + (2 * 14 * 14 * 64 * 32 * 9 + 2 * 3136 * 128 + 2 * 128 * 10),
}


def run_peer(model, threads, mode):
    out = subprocess.run(["/usr/bin/python3", PEER, model, "1", "64", str(threads)],
                         env=peers.env(mode), check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["train_samples_per_s"]


def run_hpm(model, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        subprocess.run([os.path.join(ROOT, "build", "hpm"), "train",
                        os.path.join(ROOT, "examples", f"fashion_{model}.toml"), "--set", "train.epochs=1",
                        "--threads", str(threads), "--report", rep.name],
                       check=True, capture_output=True, text=True)
        return json.load(open(rep.name))["train_samples_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    peers.install()
    print(peers.machine(), flush=True)
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        peak = peers.sgemm_peak(ROOT, threads)
        modes = ["blas", "torch"] if threads > 1 else ["blas"]
        for model in args.models.split(","):
            h, runs = [], {m: [] for m in modes + ["default"]}
            for _ in range(args.repeats):
                h.append(run_hpm(model, threads))
                for m in runs:
                    runs[m].append(run_peer(model, threads, m))
            mh = statistics.median(h)
            med = {m: statistics.median(v) for m, v in runs.items()}
            mb, md = max(med[m] for m in modes), med["default"]
            gflops = mh * FLOPS_PER_SAMPLE[model] / 1e9
            row = {"model": model, "threads": threads, "hpm_samples_per_s": round(mh),
                   "torch_best_samples_per_s": round(mb), "torch_default_samples_per_s": round(md),
                   "torch_threads_to_blas": round(med["blas"]),
                   "torch_threads_to_torch": round(med["torch"]) if "torch" in med else None,
                   "ratio_vs_torch_best": round(mh / mb, 2), "ratio_vs_torch_default": round(mh / md, 2),
                   "hpm_gflops": round(gflops, 1), "sgemm_peak_gflops": round(peak, 1),
                   "fraction_of_peak": round(gflops / peak, 2), "repeats": args.repeats}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| model | threads | hpm samples/s | PyTorch best (blas / torch pool) | ratio | PyTorch default | ratio | hpm GFLOP/s | SGEMM peak | fraction of peak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        split = f"{r['torch_threads_to_blas']} / {r['torch_threads_to_torch']}" if r["torch_threads_to_torch"] else "1 thread"
        print(f"| {r['model']} | {r['threads']} | {r['hpm_samples_per_s']} | {r['torch_best_samples_per_s']} ({split}) | "
              f"{r['ratio_vs_torch_best']}x | {r['torch_default_samples_per_s']} | {r['ratio_vs_torch_default']}x | "
              f"{r['hpm_gflops']} | {r['sgemm_peak_gflops']} | {r['fraction_of_peak']} |")


if __name__ == "__main__":
    main()
