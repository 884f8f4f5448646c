#!/bin/sh
# run_venv.sh PYTHON SCRIPT [ARGS] — run a plain test script with PYTHON
# (build/venv-pypi's, which has PyPI safetensors); exit 77 (meson: skipped)
# when that interpreter is absent (ENGINED_NO_PYPI=1 setups).
py="$1"
shift
if [ ! -x "$py" ]; then
	echo "skipped: $py not found (run tests/integration/setup_venv.sh)"
	exit 77
fi
exec "$py" "$@"
