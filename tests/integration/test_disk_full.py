"""A full and a read-only file system under the checkpoint root, for real.

The daemon runs in its own mount namespace (`unshare -m`, or `unshare -rm`
with a user namespace where plain -m is not allowed) with a small tmpfs
mounted as its checkpoint root; the test sees that file system through
/proc/<pid>/root and fills it with a file of its own. A SaveCheckpoint
that runs out of space answers RESOURCE_EXHAUSTED naming the path, leaves
no partial checkpoint (no temporary, no final directory, `latest` as it
was, the space it took freed again), and the engine keeps serving; once
the filler is gone the same save works. A read-only root answers
FAILED_PRECONDITION naming the path. Skipped (with the reason) only where
no such namespace can be made.

Run from the source root (meson runs it through run_py.sh):
ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_disk_full.py
"""
import errno
import os
import subprocess

import grpc
import pytest

from daemon_fixture import Daemon, make_tmp
from rpc_expect import expect_details as expect
from engined_client import EngineClient

SC = grpc.StatusCode
TMPFS_SIZE = 48 << 20       # the tiny preset's checkpoint is about 11 MiB
MOUNT = 'mount -t tmpfs -o size=%d none "$0" && exec "$@"' % TMPFS_SIZE


def namespace_wrap():
    """The unshare prefix that can mount a tmpfs here, or None and why."""
    probe = make_tmp(prefix="engined-ns-probe-")
    why = []
    try:
        for cmd in (["unshare", "-m"], ["unshare", "-rm"]):
            try:
                r = subprocess.run(cmd + ["sh", "-c", MOUNT, probe, "true"],
                                   capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as e:
                why.append("%s: %s" % (" ".join(cmd), e))
                continue
            if r.returncode == 0:
                return cmd, None
            why.append("%s: %s" % (" ".join(cmd), r.stderr.decode(errors="replace").strip()))
    finally:
        os.rmdir(probe)
    return None, "; ".join(why)


@pytest.fixture(scope="module")
def ns_daemon():
    wrap, why = namespace_wrap()
    if not wrap:
        pytest.skip("no mount namespace with a tmpfs can be made here: " + why)
    tmp = make_tmp(prefix="engined-full-")
    root = os.path.join(tmp, "checkpoints")
    os.makedirs(root)
    d = Daemon(tmp=tmp, wrap=wrap + ["sh", "-c", MOUNT, root])
    d.unshare = wrap
    try:
        yield d
    finally:
        code = d.stop()
        if code != 0:
            print("\n--- engined log (tail) ---\n" + d.log_text()[-4000:])
    assert code == 0, "engined exited with %s" % code


@pytest.fixture(scope="module")
def client(ns_daemon):
    c = EngineClient(ns_daemon.addr, timeout=60)
    try:
        c.initialize(replace=True, preset="tiny")
        yield c
    finally:
        c.close()


def inside(d, *parts):
    """A path of the daemon's checkpoint root as the daemon sees it."""
    return os.path.join("/proc/%d/root" % d.proc.pid, d.ckpt_root.lstrip("/"), *parts)


def fill(path, leave):
    """Write zeros to path until at most `leave` bytes stay free."""
    st = os.statvfs(os.path.dirname(path))
    want = st.f_bavail * st.f_frsize - leave
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as f:
        try:
            while want > 0:
                n = f.write(chunk[:min(len(chunk), want)])
                want -= n
            f.flush()
            os.fsync(f.fileno())
        except OSError as e:
            assert e.errno == errno.ENOSPC, e


def free_bytes(d):
    st = os.statvfs(inside(d))
    return st.f_bavail * st.f_frsize



def test_disk_full(ns_daemon, client):
    d = ns_daemon
    assert os.statvfs(inside(d)).f_blocks * os.statvfs(inside(d)).f_frsize == TMPFS_SIZE
    assert client.save_checkpoint("run/base", global_step=1).path == "run/base"
    latest = open(inside(d, "run", "latest")).read()
    assert latest == "base"
    filler = inside(d, "filler")
    # Full to the last page (the first file fails), then room for the
    # model but not the optimizer state (the safetensors writer fails).
    for leave in (0, 5 << 20):
        fill(filler, leave)
        before = free_bytes(d)
        msg = expect(SC.RESOURCE_EXHAUSTED, client.save_checkpoint, "run/ck", global_step=2)
        assert "<root>/run/.ck.tmp-" in msg and "No space left on device" in msg, msg
        assert sorted(os.listdir(inside(d, "run"))) == ["base", "latest"], \
            os.listdir(inside(d, "run"))
        assert open(inside(d, "run", "latest")).read() == "base"
        assert free_bytes(d) == before, "the failed save left data behind"
        # Still serving, state intact.
        assert client.get_status().initialized
        assert client.load_checkpoint("run") == 1
        os.unlink(filler)
    r = client.save_checkpoint("run/ck", global_step=2, max_to_keep=1)
    assert r.bytes > 0
    assert sorted(os.listdir(inside(d, "run"))) == ["ck", "latest"]
    assert open(inside(d, "run", "latest")).read() == "ck"
    assert client.load_checkpoint("run") == 2


def test_read_only_root(ns_daemon, client):
    """A read-only checkpoint root is the deployment's state:
    FAILED_PRECONDITION naming the path; loads still work."""
    d = ns_daemon
    client.save_checkpoint("ro/base", global_step=3)
    enter = ["nsenter", "-t", str(d.proc.pid), "-m"] + (
        ["-U", "--preserve-credentials"] if "-rm" in d.unshare else [])
    remount = enter + ["mount", "-o", "remount,ro", d.ckpt_root]
    r = subprocess.run(remount, capture_output=True)
    assert r.returncode == 0, r.stderr
    try:
        msg = expect(SC.FAILED_PRECONDITION, client.save_checkpoint, "ro/ck", global_step=4)
        assert "<root>/ro" in msg and "Read-only file system" in msg, msg
        assert client.load_checkpoint("ro/base") == 3
    finally:
        r = subprocess.run(enter + ["mount", "-o", "remount,rw", d.ckpt_root],
                           capture_output=True)
        assert r.returncode == 0, r.stderr
    client.save_checkpoint("ro/ck", global_step=4)
    assert client.load_checkpoint("ro") == 4
