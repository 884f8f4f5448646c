#!/bin/sh
# setup_venv.sh BUILD_DIR — make BUILD_DIR/venv-pypi: Debian's python3 with
# current grpcio / protobuf / grpcio-tools / ml-dtypes from PyPI plus the
# test extras (pytest, grpclib, safetensors; grpcio-health-checking and
# grpcio-reflection, the official clients of the health/reflection test),
# and install client/python into it. The integration tests
# 'integration_py_pypi', 'integration_client_api_pypi',
# 'integration_health_reflection' and 'integration_packaging' run with it
# (skipped without it).
# torch is never installed from PyPI: tests use Debian's through
# --system-site-packages, so numpy stays Debian's (the one that torch is
# built against; ml-dtypes then resolves to a release that supports it).
set -eu
build="${1:?usage: setup_venv.sh BUILD_DIR}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$build/venv-pypi"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
numpy="$(/usr/bin/python3 -c 'import numpy; print(numpy.__version__)')"
"$venv/bin/pip" install -q --upgrade grpcio protobuf grpcio-tools ml-dtypes "numpy==$numpy" \
	pytest grpclib safetensors grpcio-health-checking grpcio-reflection
# The client installs without a protoc binary (PATH holds only the venv;
# its stubs come from the grpcio-tools build dependency), and imports.
bin="$(cd "$venv/bin" && pwd)"
PATH="$bin" "$bin/pip" install -q "$root/client/python"
(cd / && "$bin/python" -c "import engined_client.aio, engined_client._proto.engine_pb2")
