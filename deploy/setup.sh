#!/usr/bin/env bash
# deploy/setup.sh — set up a fresh Debian 12 machine for engined and build it.
#
# Installs the Debian packages the build and the tests need (apt-get; root or
# sudo), configures and builds into ./build, and makes build/venv-pypi (the
# Python client with current grpcio from PyPI) and build/venv-verl (verl
# 0.9.1 and torch 2.x for the verl backend). Safe to run again: it only
# installs what is missing and rebuilds what changed.
#   ENGINED_BUILD_DIR   build directory (default: build)
#   ENGINED_CUDA        auto (default) | enabled | disabled: the CUDA device
#   CI=true             warnings become errors (-Dwerror=true)
#
# CUDA needs nothing installed here: the toolkit (nvcc, cuBLASLt, the static
# runtime) is under /usr/local/cuda on these machines, and meson looks for
# nvcc there too, so /usr/local/cuda/bin need not be on PATH. Without it the
# build registers no CUDA device (a stub) and says so in its summary.
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir=${ENGINED_BUILD_DIR:-build}

packages=(
  build-essential meson ninja-build pkg-config
  libdnnl-dev          # oneDNN: every CPU matmul
  libjansson-dev       # JSON: HF config.json, safetensors headers, engine_state.json
  libxxhash-dev        # XXH64 checksums of checkpoint files
  libgrpc-dev          # gRPC C core: the daemon's server and the C client
  libprotobuf-c-dev protobuf-c-compiler   # C messages generated from proto/ at build time
  libuv1-dev           # the daemon's signal / timer loop
  libgloo-dev          # Gloo: the collectives of a data-parallel group on the CPU (engines/dist/gloo/)
  protobuf-compiler    # Python stubs of the client package
  check                # unit tests
  python3-grpcio python3-protobuf python3-numpy python3-venv   # Python client, tests
  python3-pytest       # runs the Python integration tests (tests/integration/conftest.py)
  python3-torch        # the independent torch reference of the tests
  libopenblas0-pthread # a real BLAS under Debian's torch (the benchmark's peer)
  libinih-dev          # engined's INI configuration file
  libsystemd-dev       # sd_notify: READY/WATCHDOG/STATUS/STOPPING for the Type=notify unit
  libmicrohttpd-dev    # the Prometheus metrics endpoint
  libssl-dev           # OpenSSL: TLS files checked (key matches cert) before gRPC uses them
  openssl              # the TLS tests make their certificates with it
  systemd              # systemd-analyze verify / sysusers / tmpfiles on the unit files in tests
  # The sanitizer and fuzz build of .ci/run (tests/fuzz/README.md): clang
  # with libFuzzer and the sanitizer runtimes, LLVM's OpenMP for clang,
  # llvm-symbolizer for file:line in the sanitizers' reports.
  clang libclang-rt-dev libomp-dev llvm
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

werror=false
[ "${CI:-}" = "true" ] && werror=true
cuda=${ENGINED_CUDA:-auto}
if [ -d "$build_dir/meson-private" ]; then
  meson configure "$build_dir" -Dwerror=$werror -Dcuda="$cuda" >/dev/null
else
  meson setup "$build_dir" -Dwerror=$werror -Dcuda="$cuda"
fi
ninja -C "$build_dir"

# The Python client against current grpcio/protobuf from PyPI (and grpclib,
# safetensors for the interoperability tests), beside Debian's versions.
# Skipped with ENGINED_NO_PYPI=1 (offline); its tests then report "skipped".
if [ "${ENGINED_NO_PYPI:-0}" != "1" ]; then
  tests/integration/setup_venv.sh "$build_dir"
fi

# The verl backend's tests: the real verl 0.9.1 with PyPI's torch 2.x in a
# venv of its own (about 6.4 GB, about 2.5 min the first time; then only
# the client is reinstalled). Skipped with ENGINED_NO_VERL=1 or
# ENGINED_NO_PYPI=1; its tests then report "skipped".
if [ "${ENGINED_NO_PYPI:-0}" != "1" ] && [ "${ENGINED_NO_VERL:-0}" != "1" ]; then
  tests/verl/setup_venv.sh "$build_dir"
fi
