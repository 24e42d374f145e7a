#!/usr/bin/env bash
# Installs the peers that bench/ and tests/golden/generate.py measure hpm against, as
# ../shared/peers/README.md says: Debian's PyTorch with the pthread OpenBLAS (without
# libopenblas0-pthread PyTorch falls back to the reference BLAS and runs tens of times slower, so
# every ratio against it would be void), OpenMPI, and the fortunes corpus. Safe to re-run.
set -euo pipefail

PACKAGES=(python3-torch python3-numpy libopenblas0-pthread openmpi-bin libopenmpi-dev fortunes
          dataset-fashion-mnist)
"$(dirname "$0")/install_packages.sh" "${PACKAGES[@]}"
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)
case $blas in
  *openblas*) ;;
  *) echo "setup_peers: libblas.so.3 is $blas, not OpenBLAS: PyTorch would run on the reference BLAS" >&2
     exit 1 ;;
esac
