#!/bin/sh
# run_py.sh PYTHON TEST_FILE [PYTEST ARGS] — run the pytest module TEST_FILE
# (tests/integration/test_*.py) with the given interpreter and this
# directory's pytest.ini. Exit 77 (meson: skipped) when that interpreter is
# absent (e.g. the PyPI venv that tests/integration/setup_venv.sh makes);
# pytest's exit 5 (no test collected) is a failure.
py="$1"
shift
if [ ! -x "$py" ]; then
	echo "skipped: $py not found (run tests/integration/setup_venv.sh)"
	exit 77
fi
if ! "$py" -c "import pytest" 2>/dev/null; then
	echo "run_py.sh: no pytest for $py (deploy/setup.sh --tests installs python3-pytest," \
		"tests/integration/setup_venv.sh installs it in the venv)"
	exit 1
fi
here="$(cd "$(dirname "$0")" && pwd)"
# No bytecode (nor pytest's rewritten modules) written into the source tree;
# no pytest plugins but pytest's own (the tests need none).
export PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
"$py" -m pytest -c "$here/pytest.ini" --rootdir "$here" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
	echo "run_py.sh: pytest collected no tests: failing"
	exit 1
fi
exit "$rc"
