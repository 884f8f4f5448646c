"""conftest.py — the verl tests' pytest fixtures: tests/integration's
(a module's shared daemon `daemon`, its `client`, `daemon_args`), loaded
from that file so that both directories have one definition. (run_py.sh
roots pytest in tests/integration, whose conftest does not reach here.)"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "integration_conftest",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration", "conftest.py"))
_integration = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_integration)

daemon_args = _integration.daemon_args
daemon = _integration.daemon
client = _integration.client
pytest_report_header = _integration.pytest_report_header
