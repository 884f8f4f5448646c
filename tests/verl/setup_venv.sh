#!/bin/sh
# setup_venv.sh BUILD_DIR — make BUILD_DIR/venv-verl: a venv of its own
# (no system site packages: Debian's torch 1.13 and numpy 1.x must not mix
# with PyPI's torch 2.x) with the real verl 0.9.1, torch 2.x (CUDA wheels,
# about 5 GB on disk, about 2.5 min to install), tensordict, transformers,
# pinned by constraints.txt, the tinker SDK and tinker-cookbook (the Tinker
# gateway's tests); then the engined client package (its
# `verl.plugins` entry point registers the engined backend). The 'verl'
# test suite runs with it (skipped without it). Idempotent: pip skips what
# is installed.
set -eu
build="${1:?usage: setup_venv.sh BUILD_DIR}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$build/venv-verl"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
bin="$(cd "$venv/bin" && pwd)"
"$bin/pip" install -q --upgrade pip
"$bin/pip" install -q -r "$here/requirements.txt" -c "$here/constraints.txt"
# tinker-cookbook without its unsatisfiable tml-renderers pin (requirements.txt).
"$bin/pip" install -q --no-deps -c "$here/constraints.txt" tinker-cookbook
PATH="$bin:$PATH" "$bin/pip" install -q "$root/client/python"
(cd / && "$bin/python" -W ignore -c "import verl, engined_client.verl")
