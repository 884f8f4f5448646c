"""The engine's threads: the OpenMP wait policy the serving process really
runs with (daemon/omp_policy.h) and the thread count chosen for
`[engine] threads = 0` (engines/device/cpu_budget.h), read from what the
daemon and libgomp say, never from timings.

OMP_DISPLAY_ENV=verbose makes libgomp print its effective settings each
time it loads: once for a daemon that keeps its environment, twice for one
that re-executes itself, and the last block is that of the process that
serves. Run from the source root (meson runs it through run_py.sh):
ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_threads.py
"""
import os
import re
import shutil

import numpy as np
import pytest

from daemon_fixture import Daemon

from engined_client import EngineClient

OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """The daemons here inherit no OpenMP setting from the test's caller."""
    for k in OMP_VARS:
        monkeypatch.delenv(k, raising=False)


def gomp_blocks(log):
    """libgomp's OMP_DISPLAY_ENV blocks, each as {name: value}."""
    blocks = re.findall(r"OPENMP DISPLAY ENVIRONMENT BEGIN(.*?)OPENMP DISPLAY ENVIRONMENT END",
                        log, re.S)
    return [dict(re.findall(r"^\s*(\w+) = '([^']*)'", b, re.M)) for b in blocks]


def environ_of(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        return dict(e.split("=", 1) for e in f.read().decode().split("\0") if "=" in e)


def threads_line(log):
    lines = [ln for ln in log.splitlines() if "engine threads:" in ln]
    assert len(lines) == 1, log
    return lines[0]


def serves(d):
    """The process that answers is the one started (the re-exec kept its
    PID) and trains. Returns its OpenMP runtime: "libgomp" (gcc builds) or
    "libomp" (the clang sanitizer build: LLVM's runtime for engined's own
    code, next to the libgomp Debian's oneDNN links), whose OMP_DISPLAY_ENV
    blocks differ in number and content; the block checks below are for a
    process with libgomp alone."""
    with EngineClient(d.addr, timeout=60) as c:
        c.initialize(preset="tiny", seed=1)
        r = c.forward_backward(np.arange(16, dtype=np.int32), [16], loss="sft")
        assert np.isfinite(r.loss)
    assert os.readlink("/proc/%d/exe" % d.proc.pid) == os.path.realpath(d.bin)
    with open("/proc/%d/maps" % d.proc.pid) as f:
        maps = f.read()
    return "libomp" if "libomp" in maps else "libgomp"


def test_default_policy_is_passive_before_libgomp_loads():
    d = Daemon("--threads", "0", env={"OMP_DISPLAY_ENV": "verbose"})
    try:
        runtime = serves(d)
        env = environ_of(d.proc.pid)
        log = d.log_text()
    finally:
        d.stop()
    assert env.get("OMP_WAIT_POLICY") == "passive"
    assert "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=unset (set by engined" in threads_line(log)
    # libgomp prints "OMP_WAIT_POLICY = 'PASSIVE'", libomp "[host] OMP_WAIT_POLICY='PASSIVE'".
    assert re.search(r"OMP_WAIT_POLICY ?= ?'PASSIVE'", log), log
    if runtime != "libgomp":
        return
    blocks = gomp_blocks(log)
    # First load: libgomp's default spin; then, after the re-exec, passive.
    assert len(blocks) == 2, log
    assert blocks[0]["GOMP_SPINCOUNT"] != "0"
    assert blocks[-1]["OMP_WAIT_POLICY"] == "PASSIVE"
    assert blocks[-1]["GOMP_SPINCOUNT"] == "0"
    assert "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=unset (set by engined" in threads_line(log)


@pytest.mark.parametrize("var,value,spin", [
    ("OMP_WAIT_POLICY", "active", "30000000000"),
    ("GOMP_SPINCOUNT", "300000", "300000"),
    ("OMP_WAIT_POLICY", "passive", "0"),
])
def test_operator_setting_is_kept(var, value, spin):
    d = Daemon(env={var: value, "OMP_DISPLAY_ENV": "verbose"})
    try:
        runtime = serves(d)
        env = environ_of(d.proc.pid)
        log = d.log_text()
    finally:
        d.stop()
    assert env.get(var) == value
    assert "ENGINED_OMP_POLICY_SET" not in env
    assert "%s=%s" % (var, value) in threads_line(log)
    assert "(from the environment)" in threads_line(log)
    if runtime != "libgomp":
        return
    blocks = gomp_blocks(log)
    assert len(blocks) == 1, log   # no re-exec
    assert blocks[0]["GOMP_SPINCOUNT"] == spin
    assert "%s=%s" % (var, value) in threads_line(log)
    assert "(from the environment)" in threads_line(log)


def test_threads_zero_is_the_affinity_mask():
    cpus = len(os.sched_getaffinity(0))
    d = Daemon("--threads", "0")
    try:
        line = threads_line(d.log_text())
    finally:
        d.stop()
    assert re.search(r"engine threads: \d+ \(affinity %d CPUs" % cpus, line), line
    n = int(re.search(r"engine threads: (\d+) ", line).group(1))
    assert 1 <= n <= cpus


@pytest.mark.skipif(shutil.which("taskset") is None, reason="no taskset")
def test_threads_zero_follows_a_narrowed_mask():
    cpu = sorted(os.sched_getaffinity(0))[0]
    d = Daemon("--threads", "0", wrap=["taskset", "-c", str(cpu)])
    try:
        serves(d)
        line = threads_line(d.log_text())
    finally:
        d.stop()
    assert "engine threads: 1 (affinity 1 CPUs" in line, line


def test_threads_set_explicitly():
    d = Daemon("--threads", "3")
    try:
        log = d.log_text()
    finally:
        d.stop()
    assert "engine threads: 3, from [engine] threads" in threads_line(log)
