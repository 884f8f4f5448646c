"""An unrecoverable device error (a sticky CUDA error on a GPU) seen by the
real engined: the call that hit it gets INTERNAL naming the failure, later
calls get INTERNAL without running, health says NOT_SERVING, and the daemon
exits with status 1 so that systemd restarts it.

The CPU device stands in for CUDA: ENGINED_CPU_FAIL_AT_ALLOC=N marks it
failed at its N-th device allocation, as a sticky error would. The tiny
preset's Initialize makes 5 device allocations (4 state families and the
RoPE table), so N = 6 fails the first ForwardBackward.

Each test starts its own daemon. Run from the source root (meson runs it
through run_py.sh): ENGINED_BIN=build/daemon/engined
PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_device_failure.py
"""
import grpc
import numpy as np

from daemon_fixture import Daemon

from engined_client import EngineClient


def expect_code(fn, code, text):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        assert text in e.details(), e.details()
        return e.details()
    raise AssertionError("expected %s" % code)


def test_sticky_device_failure_restarts():
    d = Daemon(env={"ENGINED_CPU_FAIL_AT_ALLOC": "6"})
    try:
        with EngineClient(d.addr, timeout=30) as c:
            c.initialize(replace=True, preset="tiny")
            assert c.health() == "SERVING"
            ids = np.arange(16, dtype=np.int32) % 50
            msg = expect_code(lambda: c.forward_backward(ids, [16], loss="sft"),
                              grpc.StatusCode.INTERNAL, "device failed")
            assert "ENGINED_CPU_FAIL_AT_ALLOC" in msg, msg
        assert d.wait(30) == 1, d.log_text()
        log = d.log_text()
        assert "device failed: injected device failure" in log, log
        assert "exit 1: restart me" in log, log
    finally:
        d.stop()


def test_healthy_daemon_exits_zero():
    d = Daemon()
    try:
        with EngineClient(d.addr, timeout=30) as c:
            c.initialize(replace=True, preset="tiny")
            ids = np.arange(16, dtype=np.int32) % 50
            c.forward_backward(ids, [16], loss="sft")
    finally:
        assert d.stop() == 0
