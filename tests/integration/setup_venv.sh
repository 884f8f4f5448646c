#!/bin/sh
# setup_venv.sh BUILD_DIR — make BUILD_DIR/venv-pypi: Debian's python3 with
# current grpcio / protobuf / grpcio-tools from PyPI plus the test extras
# (pytest, grpclib, safetensors; grpcio-health-checking and
# grpcio-reflection, the official clients of the health/reflection test),
# and install client/python into it. The integration tests
# 'integration_py_pypi' and 'integration_health_reflection' run with it
# (skipped without it).
# torch is never installed from PyPI: tests use Debian's through
# --system-site-packages.
set -eu
build="${1:?usage: setup_venv.sh BUILD_DIR}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$build/venv-pypi"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --upgrade grpcio protobuf grpcio-tools pytest grpclib safetensors \
	grpcio-health-checking grpcio-reflection
"$venv/bin/pip" install -q "$root/client/python"
