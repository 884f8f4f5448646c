"""Path confinement of the real engined: checkpoint and model paths are
resolved by the kernel beneath their root (openat2 RESOLVE_BENEATH) and
pinned while the engine writes or reads. '..', absolute paths, symlinks
out of the root (to /etc, to a directory outside) are refused
PERMISSION_DENIED; a symlink inside the root is fine; and a directory
swapped for a symlink to the outside while saves run redirects nothing:
every byte lands under the root.

The tests share one daemon with an initialized engine (the `daemon` and
`client` fixtures). Run from the source root (meson runs it through
run_py.sh): ENGINED_BIN=build/daemon/engined
PYTHONPATH=client/python:build/tests/integration
/usr/bin/python3 -m pytest tests/integration/test_paths.py [-k name]
"""
import os
import tempfile
import threading
import time

import grpc
import pytest

from engined_client import EngineClient

SC = grpc.StatusCode


@pytest.fixture(scope="module")
def client(daemon):
    """The shared daemon's client, its engine initialized (tiny preset)."""
    c = EngineClient(daemon.addr, timeout=60)
    try:
        c.initialize(preset="tiny")
        yield c
    finally:
        c.close()


def expect(code, fn, *args, field=None, **kw):
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        assert e.code() == code, "expected %s, got %s: %s" % (code, e.code(), e.details())
        if field:
            assert field in e.details(), "message %r lacks %r" % (e.details(), field)
        return e
    raise AssertionError("expected %s, call succeeded" % code)


def files_under(path):
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        out += [os.path.join(dirpath, n) for n in dirnames + filenames]
    return out


def test_refused_paths(daemon, client):
    root = daemon.ckpt_root
    outside = tempfile.mkdtemp(prefix="engined-outside-")
    os.symlink("/etc", os.path.join(root, "etc"))
    os.symlink(outside, os.path.join(root, "out"))
    os.symlink("../" + os.path.basename(root) + "/../x", os.path.join(root, "rel-out"))
    os.makedirs(os.path.join(root, "real"))
    os.symlink(outside, os.path.join(root, "real", "ck-link"))
    for path in ["../x", "a/../../x", "/tmp/x", "/etc", "etc/x", "etc", "out/ck", "out",
                 "out/deeper/ck", "rel-out/ck", "real/ck-link"]:
        expect(SC.PERMISSION_DENIED, client.save_checkpoint, path, field="path")
    for path in ["../x", "/etc", "etc", "out", "rel-out"]:
        expect(SC.PERMISSION_DENIED, client.load_checkpoint, path, field="path")
    expect(SC.NOT_FOUND, client.load_checkpoint, "real/none", field="path")
    # Models: the same rules under the model root.
    mroot = daemon.model_root
    os.symlink("/etc", os.path.join(mroot, "etc"))
    for path in ["../checkpoints", "/etc", "etc", "etc/ssl"]:
        expect(SC.PERMISSION_DENIED, client.initialize, model_path=path, field="model_path")
    assert files_under(outside) == [], files_under(outside)
    # A symlink that stays inside the root is followed.
    os.symlink("real", os.path.join(root, "alias"))
    r = client.save_checkpoint("alias/ck", global_step=3)
    assert r.path == "alias/ck"
    assert os.path.exists(os.path.join(root, "real/ck/model.safetensors"))
    assert client.load_checkpoint("alias/ck") == 3
    assert client.load_checkpoint("real/ck") == 3


VANISHED = "path: the directory 'run' was removed or replaced while in use"


def test_symlink_swap_during_saves(daemon, client):
    """A thread keeps swapping the directory `run` for a symlink to a
    directory outside the root (and back) while checkpoints are saved into
    run/ck-N. Each save must either be refused or land under the root,
    whatever the timing; the outside directory stays empty. A save whose
    pinned directory the swap removed (the toggler's rename replaces an
    empty `run` the daemon had just made) answers NOT_FOUND saying so."""
    root = daemon.ckpt_root
    outside = tempfile.mkdtemp(prefix="engined-swap-outside-")
    run, real = os.path.join(root, "run"), os.path.join(root, "run.real")
    os.makedirs(run)
    stop = threading.Event()
    swaps = [0]

    def toggler():
        while not stop.is_set():
            try:
                os.rename(run, real)
                os.symlink(outside, run)
                swaps[0] += 1
                time.sleep(0.0005)
                os.unlink(run)
                os.rename(real, run)
            except OSError:
                # The daemon re-created `run` in the gap: start over.
                try:
                    if os.path.islink(run):
                        os.unlink(run)
                except OSError:
                    pass
            time.sleep(0.0005)

    t = threading.Thread(target=toggler)
    t.start()
    codes = {}
    try:
        t0 = time.time()
        i = 0
        while time.time() - t0 < 3 or i < 20:
            try:
                client.save_checkpoint("run/ck-%d" % i, global_step=i)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
                if e.code() != SC.PERMISSION_DENIED and not (
                        e.code() == SC.NOT_FOUND and VANISHED in e.details()):
                    codes.setdefault("messages", []).append(e.details())
            i += 1
            if i >= 200:
                break
    finally:
        stop.set()
        t.join()
    leaked = files_under(outside)
    assert leaked == [], "written outside the root: %r" % leaked[:10]
    assert set(codes) <= {"OK", "PERMISSION_DENIED", "NOT_FOUND"}, codes
    assert swaps[0] > 50, swaps
    assert codes.get("OK", 0) >= 1, codes
    # Every successful save is a complete checkpoint somewhere under the root.
    saved = [p for p in files_under(root) if p.endswith("/engine_state.json") and "/ck-" in p]
    assert len(saved) >= codes["OK"], (len(saved), codes)
    print("%d saves: %s, %d swaps" % (i, codes, swaps[0]))
