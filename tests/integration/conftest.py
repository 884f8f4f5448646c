"""pytest fixtures around a real engined (daemon_fixture.Daemon).

daemon: one daemon shared by the tests of a module (module scope), started
with the module's `daemon_args` (override that fixture in the module: a
tuple of extra command-line arguments). At the end of the module it is
stopped and must exit 0; when a test of the module failed or it did not
exit 0, the tail of its log is printed.
client: an EngineClient of that daemon (module scope).
Tests that need a daemon with special flags (or with the test hook that
holds jobs: Daemon(hold=True), d.hold()/d.release(), wait_for) start their
own Daemon. Options: pytest.ini; meson runs each module through run_py.sh.
"""
import sys

import grpc
import pytest

from daemon_fixture import Daemon
from engined_client import EngineClient


def pytest_report_header(config):
    import google.protobuf
    return "python %s, grpcio %s, protobuf %s" % (
        sys.version.split()[0], grpc.__version__, google.protobuf.__version__)


@pytest.fixture(scope="module")
def daemon_args():
    """Extra engined arguments of the module's shared daemon."""
    return ()


@pytest.fixture(scope="module")
def daemon(request, daemon_args):
    d = Daemon(*daemon_args)
    failed_before = request.session.testsfailed
    try:
        yield d
    finally:
        code = d.stop()
        if code != 0 or request.session.testsfailed > failed_before:
            print("\n--- engined log (tail) ---\n" + d.log_text()[-4000:])
    assert code == 0, "engined exited with %s" % code


@pytest.fixture(scope="module")
def client(daemon):
    c = EngineClient(daemon.addr, timeout=120)
    yield c
    c.close()
