#!/usr/bin/env bash
# Installs every Debian package hpm needs, then configures and builds into build/ (the CLI is
# build/hpm). Safe to re-run: it skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev            # GEMM and convolution kernels (oneDNN, OpenMP runtime)
  ocl-icd-opencl-dev opencl-c-headers  # Debian's dnnl-config.cmake insists on finding OpenCL
  libgloo-dev            # collectives across processes and hosts (comm layer's gloo backend)
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # parameter servers
  openssl                # the parameter-server TLS test makes its certificate with the CLI
  iproute2               # the test that runs workers in network namespaces (ip netns, tc)
  libtomlplusplus-dev    # config files
  libcli11-dev           # command line
  nlohmann-json3-dev     # reports, safetensors headers
  zlib1g-dev             # gzip'd IDX, TFRecord compression
  libsentencepiece-dev   # subword tokenizers (hpm data tokenizer, [data] tokenizer)
  sentencepiece          # spm_encode: the tests compare hpm's token ids with it
  python3-protobuf       # the tests' independent reader of TensorBoard event files
  libpng-dev libjpeg62-turbo-dev  # image decoding in the input pipeline
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist  # the embedded default data set
  fortunes               # the embedded default text, for language models
)

./scripts/install_packages.sh "${PACKAGES[@]}"
# The CUDA backend's fused attention on cuDNN needs NVIDIA's cuDNN frontend headers, which Debian
# does not package: fetched once into .deps/ where CUDA's compiler is (the backend is built there).
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  ./scripts/fetch_cudnn_frontend.sh ||
    echo "setup: no cuDNN frontend (above): the CUDA backend is built without cuDNN's attention" >&2
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
