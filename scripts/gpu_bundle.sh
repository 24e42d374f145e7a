#!/usr/bin/env bash
# Packs what the GPU check (scripts/gpu_check.sh) needs on a GPU machine that has the CUDA 13
# runtime, cuBLAS and PyTorch but none of Debian's packages, into .gpu/ (ignored by git; a device
# call carries it): the Release build's hpm and CUDA suite, stripped, with every shared library
# they load except glibc's and CUDA's; the Fashion-MNIST and fortunes data; the PyTorch peer.
# Everything travels in one xz archive (the carried tree must stay under 64 MiB).
#   scripts/gpu_bundle.sh            # after ./scripts/setup.sh (HPM_CUDA on)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
OUT=.gpu
rm -rf "$OUT" && mkdir -p "$OUT/stage/bin" "$OUT/stage/lib" "$OUT/stage/data" "$OUT/stage/peers"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude

for b in "$BUILD/hpm" "$BUILD/tests/test_cuda"; do
  strip -o "$OUT/stage/bin/$(basename "$b")" "$b"
done
cp "$BUILD/libhpm_sentencepiece.so" "$OUT/stage/lib/"
# Shared libraries: all but the C library's and the GPU's own (the GPU machine has those, matched
# to its driver).
for b in "$BUILD/hpm" "$BUILD/tests/test_cuda" "$BUILD/libhpm_sentencepiece.so"; do
  ldd "$b" | awk '/=>/ {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libcudnn[^/]*|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$OUT/stage/lib/"; done
strip --strip-unneeded "$OUT"/stage/lib/*.so* 2>/dev/null || true

# Fashion-MNIST unzipped (hpm reads the idx files either way): xz packs the raw images 4 MB
# smaller than their gzip files, and the call carries the tree by its disk blocks (run 10's first
# try was refused at 65.3 MiB).
for f in /usr/share/datasets/fashion-mnist/*.gz; do
  zcat "$f" >"$OUT/stage/data/$(basename "$f" .gz)"
done
mkdir -p "$OUT/stage/data/fortunes"
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' -exec cp {} "$OUT/stage/data/fortunes/" \;
cp ../shared/peers/torch_gpt.py ../shared/peers/peer_env.py "$OUT/stage/peers/"

tar -C "$OUT/stage" -cf - . | xz -T2 -9e >"$OUT/bundle.tar.xz"  # -9e: 1.9 MiB under -6
rm -rf "$OUT/stage"
# What a device call carries: the tracked tree and this bundle, counted by disk blocks as the device
# tool counts them (run 10's first try was refused at 65.3 MiB of 64).
bundle_kib=$(du -k "$OUT/bundle.tar.xz" | cut -f1)
tree_kib=$(git ls-files -z | xargs -0 du -k -c 2>/dev/null | tail -1 | cut -f1)
total_kib=$((bundle_kib + tree_kib))
echo "gpu_bundle: bundle ${bundle_kib} KiB + tracked tree ${tree_kib} KiB = ${total_kib} KiB" \
  "of the 65536 a device call carries"
if [ "$total_kib" -gt 65536 ]; then
  echo "gpu_bundle: over the device call's 64 MiB: it would be refused" >&2
  exit 1
fi
