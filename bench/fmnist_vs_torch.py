#!/usr/bin/python3
"""hpm against PyTorch on Fashion-MNIST, side by side in one run.

For each model (mlp, cnn) and thread count, runs `hpm train` and ../shared/peers/torch_fmnist.py
on the same model, batch 64, one epoch, alternating REPEATS times, and prints the median training
samples/s of each and their ratio. Peers: PyTorch "at its best" (OpenBLAS told the right core,
as the peer script does when OPENBLAS_CORETYPE is unset) and out of the box (PEER_DEFAULT=1),
both with OpenBLAS pinned to the same thread count as hpm, and, for the record, the peer script
exactly as it is (its OpenBLAS then uses every core whatever the thread argument says).
Also prints hpm's training FLOP rate as a fraction of this machine's practical FP32 peak (a large
oneDNN SGEMM, bench/sgemm_peak).

usage: bench/fmnist_vs_torch.py [--models mlp,cnn] [--threads 1,2] [--repeats 3]
Needs: build/ (scripts/setup.sh), python3-torch and libopenblas0-pthread (apt-get).
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "..", "shared", "peers", "torch_fmnist.py")
# Training FLOPs per example: forward, weight gradients, and input gradients of every layer but
# the first (whose input needs none).
FLOPS_PER_SAMPLE = {
    "mlp": 2 * (784 * 512 + 512 * 256 + 256 * 10) * 2 + 2 * (512 * 256 + 256 * 10),
    "cnn": (2 * 28 * 28 * 32 * 9 + 2 * 14 * 14 * 64 * 32 * 9 + 2 * 3136 * 128 + 2 * 128 * 10) * 2
           + (2 * 14 * 14 * 64 * 32 * 9 + 2 * 3136 * 128 + 2 * 128 * 10),
}


def peer_env(default, threads, pin):
    env = dict(os.environ)
    # This sandbox presets OPENBLAS_CORETYPE; drop it so the peer script names the right core.
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    if default:
        env["PEER_DEFAULT"] = "1"
    if pin:
        # torch.set_num_threads does not reach Debian's pthread OpenBLAS, which otherwise runs its
        # GEMMs on every core: pin it so "1 thread" means one core on both sides.
        env["OPENBLAS_NUM_THREADS"] = str(threads)
    return env


def run_peer(model, threads, default, pin=True):
    out = subprocess.run(["/usr/bin/python3", PEER, model, "1", "64", str(threads)],
                         env=peer_env(default, threads, pin), check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["train_samples_per_s"]


def run_hpm(model, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        subprocess.run([os.path.join(ROOT, "build", "hpm"), "train",
                        os.path.join(ROOT, "examples", f"fashion_{model}.toml"), "--set", "train.epochs=1",
                        "--threads", str(threads), "--report", rep.name],
                       check=True, capture_output=True, text=True)
        return json.load(open(rep.name))["train_samples_per_s"]


def sgemm_peak(threads):
    out = subprocess.run([os.path.join(ROOT, "build", "bench", "sgemm_peak"), str(threads)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["sgemm_1024_gflops"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    if "openblas" not in blas:
        print(f"warning: libblas.so.3 is {blas}, not OpenBLAS: PyTorch will run far below its best "
              "(apt-get install libopenblas0-pthread)", file=sys.stderr)
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        peak = sgemm_peak(threads)
        for model in args.models.split(","):
            h, best, dflt, unpinned = [], [], [], []
            for _ in range(args.repeats):
                h.append(run_hpm(model, threads))
                best.append(run_peer(model, threads, default=False))
                dflt.append(run_peer(model, threads, default=True))
                unpinned.append(run_peer(model, threads, default=False, pin=False))
            mh, mb, md = statistics.median(h), statistics.median(best), statistics.median(dflt)
            mu = statistics.median(unpinned)
            gflops = mh * FLOPS_PER_SAMPLE[model] / 1e9
            row = {"model": model, "threads": threads, "hpm_samples_per_s": round(mh),
                   "torch_best_samples_per_s": round(mb), "torch_default_samples_per_s": round(md),
                   "ratio_vs_torch_best": round(mh / mb, 2), "ratio_vs_torch_default": round(mh / md, 2),
                   "torch_best_unpinned_samples_per_s": round(mu), "ratio_vs_torch_unpinned": round(mh / mu, 2),
                   "hpm_gflops": round(gflops, 1), "sgemm_peak_gflops": round(peak, 1),
                   "fraction_of_peak": round(gflops / peak, 2), "repeats": args.repeats}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| model | threads | hpm samples/s | PyTorch best | ratio | PyTorch default | ratio | PyTorch, OpenBLAS unpinned | ratio | hpm GFLOP/s | SGEMM peak | fraction |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['threads']} | {r['hpm_samples_per_s']} | {r['torch_best_samples_per_s']} | "
              f"{r['ratio_vs_torch_best']}x | {r['torch_default_samples_per_s']} | {r['ratio_vs_torch_default']}x | "
              f"{r['torch_best_unpinned_samples_per_s']} | {r['ratio_vs_torch_unpinned']}x | "
              f"{r['hpm_gflops']} | {r['sgemm_peak_gflops']} | {r['fraction_of_peak']} |")


if __name__ == "__main__":
    main()
