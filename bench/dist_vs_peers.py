#!/usr/bin/python3
"""hpm's data-parallel runtime against its peers, side by side in one run (issue 4).

1. All-reduce between 2 ranks: hpm local (threads sharing memory), hpm gloo (processes over TCP
   loopback), OpenMPI (../shared/peers/mpi_allreduce.c) and torch.distributed gloo
   (../shared/peers/torch_allreduce.py). The peers take whole MiB, so 4 KiB is measured for hpm only.
2. Training samples/s on Fashion-MNIST, global batch 64: hpm one replica (1 thread), Mirrored with
   2 replicas (2 threads), MultiWorkerMirrored with 2 processes of 1 thread, against PyTorch DDP
   with 2 processes of 1 thread (../shared/peers/torch_ddp.py).
3. With --against-two-threads BATCH (issue 18): Mirrored with 2 replicas against the alternative
   on one machine, one device whose kernels use both cores (--threads 2), at global batch BATCH.
Each measurement is repeated REPEATS times, alternating; medians are printed.

usage: bench/dist_vs_peers.py [--repeats 3] [--models mlp,cnn] [--against-two-threads 512]
Needs: build/ (scripts/setup.sh); installs the peers itself (scripts/setup_peers.sh).
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402

PEERS = peers.PEERS
HPM = os.path.join(ROOT, "build", "hpm")


def peer_env():
    return peers.env("blas")  # 1 thread per process: OpenBLAS and PyTorch's pool alike


def hpm_allreduce(backend, sizes):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([HPM, "bench", "allreduce", "--backend", backend, "--world", "2", "--sizes", sizes,
                        "--report", f.name], check=True, stdout=subprocess.DEVNULL)
        return {r["bytes"]: r for r in json.load(open(f.name))["results"]}


def mpi_allreduce(binary, mb, iters):
    out = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", binary, str(mb), str(iters)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds_per_allreduce"]


def torch_allreduce(mb, iters):
    out = subprocess.run(["/usr/bin/python3", os.path.join(PEERS, "torch_allreduce.py"), "2", str(mb), str(iters)],
                         check=True, capture_output=True, text=True, env=peer_env()).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds_per_allreduce"]


def hpm_train(model, extra, limit, batch=64, epochs=1):
    cfg = os.path.join(ROOT, "examples", f"fashion_{model}.toml")
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "r.json")
        base = [cfg, "--set", f"train.epochs={epochs}", "--set", f"data.train_limit={limit}", "--set", "data.test_limit=1000",
                "--set", f"data.batch_size={batch}"] + extra
        if "multi_worker" in " ".join(extra):
            rdv = os.path.join(d, "rdv")
            os.makedirs(rdv)
            common = [HPM, "train"] + base + ["--world-size", "2", "--rendezvous", rdv]
            p1 = subprocess.Popen(common + ["--rank", "1"], stdout=subprocess.DEVNULL)
            subprocess.run(common + ["--rank", "0", "--report", report], check=True, stdout=subprocess.DEVNULL)
            if p1.wait() != 0:
                raise RuntimeError("rank 1 failed")
        else:
            subprocess.run([HPM, "train"] + base + ["--report", report], check=True, stdout=subprocess.DEVNULL)
        return json.load(open(report))["train_samples_per_s"]


def torch_ddp(model, steps):
    out = subprocess.run(["/usr/bin/python3", os.path.join(PEERS, "torch_ddp.py"), model, "2", "64", str(steps)],
                         check=True, capture_output=True, text=True, env=peer_env()).stdout
    return json.loads(out.strip().splitlines()[-1])["samples_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--skip-allreduce", action="store_true")
    ap.add_argument("--against-two-threads", type=int, default=0, metavar="BATCH")
    a = ap.parse_args()
    peers.install()
    print(peers.machine(), flush=True)
    if a.against_two_threads:
        return mirrored_against_two_threads(a.repeats, a.models, a.against_two_threads)
    if not a.skip_allreduce:
        allreduce_vs_peers(a.repeats)
    training_vs_peers(a.repeats, a.models)


def allreduce_vs_peers(repeats):
    med = statistics.median

    tmp = tempfile.mkdtemp()
    mpi_bin = os.path.join(tmp, "mpi_allreduce")
    subprocess.run(["mpicc", "-O2", "-o", mpi_bin, os.path.join(PEERS, "mpi_allreduce.c")], check=True)
    runs = {k: [] for k in ("local64", "gloo64", "local4k", "gloo4k", "mpi64", "torch64")}
    for _ in range(repeats):
        loc = hpm_allreduce("local", "4K,64M")
        glo = hpm_allreduce("gloo", "4K,64M")
        runs["local64"].append(loc[64 << 20]["seconds"])
        runs["gloo64"].append(glo[64 << 20]["seconds"])
        runs["local4k"].append(loc[4096]["seconds"])
        runs["gloo4k"].append(glo[4096]["seconds"])
        runs["mpi64"].append(mpi_allreduce(mpi_bin, 64, 10))
        runs["torch64"].append(torch_allreduce(64, 10))
    shutil.rmtree(tmp)
    gb = lambda s: (64 << 20) / s / 1e9
    print("All-reduce, 2 ranks, median seconds and algorithm bandwidth (GB/s = 1e9 B/s)")
    print(f"  64 MiB: hpm local {med(runs['local64'])*1e3:.2f} ms ({gb(med(runs['local64'])):.2f} GB/s), "
          f"hpm gloo {med(runs['gloo64'])*1e3:.2f} ms ({gb(med(runs['gloo64'])):.2f} GB/s), "
          f"OpenMPI {med(runs['mpi64'])*1e3:.2f} ms ({gb(med(runs['mpi64'])):.2f} GB/s), "
          f"torch gloo {med(runs['torch64'])*1e3:.2f} ms ({gb(med(runs['torch64'])):.2f} GB/s)")
    print(f"  ratios at 64 MiB: hpm local / OpenMPI bandwidth {med(runs['mpi64'])/med(runs['local64']):.2f}x, "
          f"hpm gloo / torch gloo {med(runs['torch64'])/med(runs['gloo64']):.2f}x")
    print(f"  4 KiB: hpm local {med(runs['local4k'])*1e6:.1f} us, hpm gloo {med(runs['gloo4k'])*1e6:.1f} us")



def training_vs_peers(repeats, models):
    med = statistics.median
    for model in models.split(","):
        limit = 12800 if model == "cnn" else 60000
        steps = limit // 64
        r = {k: [] for k in ("one", "mirrored", "mwm", "ddp")}
        for _ in range(repeats):
            r["one"].append(hpm_train(model, ["--threads", "1"], limit))
            r["mirrored"].append(hpm_train(model, ["--threads", "2", "--set", "strategy.kind=mirrored",
                                                   "--set", "strategy.replicas=2"], limit))
            r["mwm"].append(hpm_train(model, ["--threads", "1", "--set", "strategy.kind=multi_worker_mirrored"], limit))
            r["ddp"].append(torch_ddp(model, min(steps, 300)))
        m = {k: med(v) for k, v in r.items()}
        print(f"{model}, global batch 64, training samples/s: one replica {m['one']:.0f}, Mirrored x2 {m['mirrored']:.0f} "
              f"({m['mirrored']/m['one']:.2f}x one replica, {m['mirrored']/m['ddp']:.2f}x DDP), "
              f"MultiWorkerMirrored 2 processes {m['mwm']:.0f} ({m['mwm']/m['ddp']:.2f}x DDP), PyTorch DDP 2 processes {m['ddp']:.0f}")


def mirrored_against_two_threads(repeats, models, batch):
    for model in models.split(","):
        epochs = 1 if model == "cnn" else 10  # about 10 s a run either way
        r = {"one": [], "mirrored": []}
        for _ in range(repeats):
            r["one"].append(hpm_train(model, ["--threads", "2"], 60000, batch, epochs))
            r["mirrored"].append(hpm_train(model, ["--threads", "2", "--set", "strategy.kind=mirrored",
                                                   "--set", "strategy.replicas=2"], 60000, batch, epochs))
        print(f"{model}, global batch {batch}, training samples/s per round: one device with 2 kernel threads "
              f"{' / '.join(f'{x:.0f}' for x in r['one'])}, Mirrored 2 replicas of 1 thread "
              f"{' / '.join(f'{x:.0f}' for x in r['mirrored'])}; medians {statistics.median(r['one']):.0f} and "
              f"{statistics.median(r['mirrored']):.0f}: Mirrored "
              f"{statistics.median(r['mirrored']) / statistics.median(r['one']):.2f}x one device", flush=True)


if __name__ == "__main__":
    sys.exit(main())
