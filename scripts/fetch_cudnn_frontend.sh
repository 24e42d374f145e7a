#!/usr/bin/env bash
# Fetches NVIDIA's cuDNN frontend (a header-only C++ library over cuDNN's graph API, MIT) into
# .deps/, where CMake finds it for the CUDA backend's fused attention on cuDNN
# (src/tensor/backend/cuda/attention_cudnn.h). Debian does not package it; PyPI's wheel
# nvidia-cudnn-frontend carries its headers, so pip downloads that wheel (pinned by version and
# hash; its compiled Python module is not used) and the headers are unpacked from it. Version 1.18
# is the newest whose headers need nothing but cuDNN and the CUDA runtime at link time (later
# ones call NVRTC and the driver API for engines of their own). Safe to re-run: it skips what is
# already there. Exits non-zero, saying why, when it cannot fetch; the build then goes without.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.18.0
SHA256=382ea063b92cbfd5b442cb75ff8422932d78276aecf139e46713ed1ad3d07af4
DEST=.deps/cudnn-frontend-$VERSION
[ -f "$DEST/include/cudnn_frontend.h" ] && exit 0

python=python3
if ! "$python" -m pip --version >/dev/null 2>&1; then
  ./scripts/install_packages.sh python3-pip
  python=/usr/bin/python3
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The headers are the same in every wheel of a version: name one platform and Python so that pip
# picks that file whatever this machine's Python is.
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 "nvidia-cudnn-frontend==$VERSION" -d "$tmp" >&2
wheel=("$tmp"/nvidia_cudnn_frontend-"$VERSION"-*.whl)
echo "$SHA256  ${wheel[0]}" | sha256sum --check --quiet - || {
  echo "fetch_cudnn_frontend: ${wheel[0]##*/} is not the file pinned by its sha256: not used" >&2
  exit 1
}
"$python" - "${wheel[0]}" "$tmp/unpacked" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.startswith("include/"):
            z.extract(name, sys.argv[2])
PY
mkdir -p .deps
rm -rf "$DEST.partial"
mv "$tmp/unpacked" "$DEST.partial"
rm -rf "$DEST"  # a tree without the header, from a run cut short
mv "$DEST.partial" "$DEST"  # whole or not at all: a cut download leaves no half tree
echo "fetch_cudnn_frontend: $DEST/include" >&2
