#!/usr/bin/env bash
# Installs the peers that bench/ and tests/golden/generate.py measure hpm against, as
# ../shared/peers/README.md says: Debian's PyTorch with the pthread OpenBLAS (without
# libopenblas0-pthread PyTorch falls back to the reference BLAS and runs tens of times slower, so
# every ratio against it would be void), OpenMPI, and the fortunes corpus. Safe to re-run.
#
#   scripts/setup_peers.sh [--torch2]
# --torch2 (or HPM_TORCH2_VENV=DIR set): also today's PyTorch 2.x from the package index in a
# virtual environment, DIR or .peers/torch2 in the repository, for bench/vs_best_torch.py. The
# wheel is built for CUDA and pulls its CUDA libraries (about 5.4 GB installed, under a minute to
# fetch here) but runs on the CPU; torch.compile there needs a C++ compiler and the interpreter's
# headers (g++, python3-dev). Kept out of .ci/run: no test needs it. Skipped when the environment
# already imports a torch 2.x; HPM_TORCH2_SPEC=torch==2.X.Y pins another version.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

torch2=0
[ -n "${HPM_TORCH2_VENV:-}" ] && torch2=1
for arg in "$@"; do
  case $arg in
    --torch2) torch2=1 ;;
    *) echo "usage: scripts/setup_peers.sh [--torch2]" >&2; exit 2 ;;
  esac
done

PACKAGES=(python3-torch python3-numpy libopenblas0-pthread openmpi-bin libopenmpi-dev fortunes
          dataset-fashion-mnist)
# torch.compile's C++ code generation on the CPU: a compiler and Python.h of the interpreter that
# makes the venv (Debian's /usr/bin/python3, whose headers python3-dev installs).
[ $torch2 = 1 ] && PACKAGES+=(python3-venv python3-dev g++)
"$(dirname "$0")/install_packages.sh" "${PACKAGES[@]}"
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)
case $blas in
  *openblas*) ;;
  *) echo "setup_peers: libblas.so.3 is $blas, not OpenBLAS: PyTorch would run on the reference BLAS" >&2
     exit 1 ;;
esac

[ $torch2 = 1 ] || exit 0
venv=${HPM_TORCH2_VENV:-$ROOT/.peers/torch2}
# Everything on stderr: the benchmarks that call this script read their peers' stdout.
if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c 'import sys, torch; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' 2>/dev/null; then
  echo "setup_peers: $venv has torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)" >&2
  exit 0
fi
echo "setup_peers: installing ${HPM_TORCH2_SPEC:-torch} into $venv (several GB)" >&2
/usr/bin/python3 -m venv "$venv" >&2
# No pip cache: it would keep a second copy of the wheels (gigabytes) under ~/.cache.
"$venv/bin/pip" install --no-cache-dir --progress-bar off --disable-pip-version-check \
  "${HPM_TORCH2_SPEC:-torch}" numpy >&2
# What bench/vs_best_torch.py relies on: a compiled function and bf16 autocast, on the CPU.
"$venv/bin/python" - >&2 <<'PY'
import torch
f = torch.compile(lambda x, w: torch.nn.functional.gelu(x @ w).sum())
x, w = torch.randn(8, 16), torch.randn(16, 16)
assert torch.allclose(f(x, w), torch.nn.functional.gelu(x @ w).sum(), rtol=1e-4)
with torch.autocast("cpu", dtype=torch.bfloat16):
    assert (x @ w).dtype == torch.bfloat16
print(f"setup_peers: torch {torch.__version__}: torch.compile and bf16 autocast run on the CPU")
PY
