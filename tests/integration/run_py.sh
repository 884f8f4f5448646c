#!/bin/sh
# run_py.sh PYTHON SCRIPT [ARGS] — run a Python integration test with the
# given interpreter; exit 77 (meson: skipped) when that interpreter is absent
# (e.g. the PyPI venv that tests/integration/setup_venv.sh makes).
py="$1"
shift
if [ ! -x "$py" ]; then
	echo "skipped: $py not found (run tests/integration/setup_venv.sh)"
	exit 77
fi
exec "$py" "$@"
