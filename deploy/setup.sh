#!/usr/bin/env bash
# deploy/setup.sh [--tests] — set up a fresh Debian 12 machine for engined
# and build it into ./build.
#
# Without --tests (the README's run command): only what the daemon,
# enginectl, the C and Python clients and the demo need: the build tools
# and libraries (about 140 MB of Debian packages on a minimal system), a
# build without the tests (-Dtests=false the first time). With --tests
# (the README's test command, .ci/run): also what the tests need: the check
# library, Debian's torch (the independent reference), pytest, clang with
# the sanitizer and libFuzzer runtimes and LLVM, debhelper and lintian for
# the packages' test (about 300 MB more), the
# tests built (-Dtests=true), and build/venv-pypi (the Python client with
# current grpcio from PyPI) and build/venv-verl (verl 0.9.1 and PyPI's
# torch 2.x with its CUDA wheels, about 6.4 GB). apt-get runs as root or
# through sudo. Safe to run again: it installs only what is missing,
# rebuilds what changed, and a run without --tests keeps a build's tests.
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
tests=false
list=false
case "${1:-}" in
  --tests) tests=true ;;
  --list) list=true ;;   # print the run command's packages (tests/unit/check_setup_run.py)
  "") ;;
  *) echo "usage: deploy/setup.sh [--tests | --list]" >&2; exit 2 ;;
esac

# What the daemon, enginectl, the clients and the demo need: what building
# needs, deploy/debian/control's Build-Depends (the one list, each with its
# reason), less the packages' own helpers; a C compiler; what the Python
# client runs with (python3-protobuf is in the list already).
mapfile -t packages < <(
  awk '/^Build-Depends:/ { f = 1; sub(/^Build-Depends:/, "") }
       f && /^[^ \t#]/ && !/^Build-Depends:/ { f = 0 }
       f && !/^#/' deploy/debian/control |
    tr ',' '\n' | sed 's/(.*)//; s/[[:space:]]//g' |
    grep -v -x -e '' -e debhelper-compat -e help2man)
packages+=(build-essential python3-grpcio python3-numpy)
if [ "$list" = true ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
# What the tests add.
test_packages=(
  check                # unit tests
  python3-venv         # build/venv-pypi, build/venv-verl
  python3-pytest       # runs the Python integration tests (tests/integration/conftest.py)
  python3-torch        # the independent torch reference of the tests
  libopenblas0-pthread # a real BLAS under Debian's torch (the benchmark's peer)
  openssl              # the TLS tests make their certificates with it
  systemd              # systemd-analyze verify / sysusers / tmpfiles on the unit files in tests
  # The Debian packages' test (tests/packaging/, deploy/build-packages.sh):
  # dpkg-buildpackage's helpers, man pages from --help, lintian, and
  # Debian's pip, setuptools and wheel for the Python wheel (no network).
  debhelper help2man lintian python3-pip python3-setuptools python3-wheel
  # The sanitizer and fuzz build of .ci/run (tests/fuzz/README.md): clang
  # with libFuzzer and the sanitizer runtimes, LLVM's OpenMP for clang,
  # llvm-symbolizer for file:line in the sanitizers' reports.
  clang libclang-rt-dev libomp-dev llvm
)
[ "$tests" = false ] || packages+=("${test_packages[@]}")

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
  # Tests on with --tests; without it a build keeps the tests it has.
  with_tests=()
  [ "$tests" = false ] || with_tests=(-Dtests=true)
  meson configure "$build_dir" -Dwerror=$werror -Dcuda="$cuda" "${with_tests[@]}" >/dev/null
else
  meson setup "$build_dir" -Dwerror=$werror -Dcuda="$cuda" -Dtests=$tests
fi
ninja -C "$build_dir"
[ "$tests" = true ] || exit 0

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
