"""What the Python benchmarks share about their peers (../shared/peers/): installing them, the
environment that runs them at their best or as an untuned install, and the machine they ran on."""
import json, os, subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "..", "shared", "peers")


def install():
    """Installs PyTorch with the pthread OpenBLAS, OpenMPI and the corpora if missing (apt-get)."""
    subprocess.run([os.path.join(ROOT, "scripts", "setup_peers.sh")], check=True)


def env(mode="blas"):
    """The environment of a peer run. mode: "blas" or "torch" (who gets the threads, see
    peer_env.py; PyTorch at its best is the better of the two), or "default" (an untuned
    install: PEER_DEFAULT=1, whatever the machine presets)."""
    e = dict(os.environ)
    if mode == "default":
        e["PEER_DEFAULT"] = "1"
    else:
        e.pop("PEER_DEFAULT", None)
        e["PEER_THREADS_TO"] = mode
    return e


def machine():
    """The CPU this run measured: model name, cores, and the flags that decide the kernels."""
    model = "unknown"
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"cpu: {model}, {os.cpu_count()} cores, {' '.join(shown)}"


def sgemm_peak(root, threads):
    """This machine's practical FP32 peak (GFLOP/s): a 1024^3 oneDNN SGEMM, bench/sgemm_peak."""
    out = subprocess.run([os.path.join(root, "build", "bench", "sgemm_peak"), str(threads)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["sgemm_1024_gflops"]
