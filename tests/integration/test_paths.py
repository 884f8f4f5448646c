"""Path confinement of the real engined: checkpoint and model paths are
resolved by the kernel beneath their root (openat2 RESOLVE_BENEATH) and
pinned while the engine writes or reads. '..', absolute paths, symlinks
out of the root (to /etc, to a directory outside) are refused
PERMISSION_DENIED; a symlink inside the root is fine; and a directory
swapped for a symlink to the outside while saves run redirects nothing:
every byte lands under the root.

Run: ENGINED_BIN=... PYTHONPATH=client/python:<dir of engine_pb2.py>
/usr/bin/python3 tests/integration/test_paths.py [filter]
"""
import os
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_fixture import Daemon, run_tests  # noqa: E402

from engined_client import EngineClient  # noqa: E402

SC = grpc.StatusCode
D = C = None


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


def test_refused_paths():
    root = D.ckpt_root
    outside = tempfile.mkdtemp(prefix="engined-outside-")
    os.symlink("/etc", os.path.join(root, "etc"))
    os.symlink(outside, os.path.join(root, "out"))
    os.symlink("../" + os.path.basename(root) + "/../x", os.path.join(root, "rel-out"))
    os.makedirs(os.path.join(root, "real"))
    os.symlink(outside, os.path.join(root, "real", "ck-link"))
    for path in ["../x", "a/../../x", "/tmp/x", "/etc", "etc/x", "etc", "out/ck", "out",
                 "out/deeper/ck", "rel-out/ck", "real/ck-link"]:
        expect(SC.PERMISSION_DENIED, C.save_checkpoint, path, field="path")
    for path in ["../x", "/etc", "etc", "out", "rel-out"]:
        expect(SC.PERMISSION_DENIED, C.load_checkpoint, path, field="path")
    expect(SC.NOT_FOUND, C.load_checkpoint, "real/none", field="path")
    # Models: the same rules under the model root.
    mroot = D.model_root
    os.symlink("/etc", os.path.join(mroot, "etc"))
    for path in ["../checkpoints", "/etc", "etc", "etc/ssl"]:
        expect(SC.PERMISSION_DENIED, C.initialize, model_path=path, field="model_path")
    assert files_under(outside) == [], files_under(outside)
    # A symlink that stays inside the root is followed.
    os.symlink("real", os.path.join(root, "alias"))
    r = C.save_checkpoint("alias/ck", global_step=3)
    assert r.path == "alias/ck"
    assert os.path.exists(os.path.join(root, "real/ck/model.safetensors"))
    assert C.load_checkpoint("alias/ck") == 3
    assert C.load_checkpoint("real/ck") == 3


VANISHED = "path: the directory 'run' was removed or replaced while in use"


def test_symlink_swap_during_saves():
    """A thread keeps swapping the directory `run` for a symlink to a
    directory outside the root (and back) while checkpoints are saved into
    run/ck-N. Each save must either be refused or land under the root,
    whatever the timing; the outside directory stays empty. A save whose
    pinned directory the swap removed (the toggler's rename replaces an
    empty `run` the daemon had just made) answers NOT_FOUND saying so."""
    root = D.ckpt_root
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
                C.save_checkpoint("run/ck-%d" % i, global_step=i)
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
    return "%d saves: %s, %d swaps" % (i, codes, swaps[0])


TESTS = [test_refused_paths, test_symlink_swap_during_saves]


def main():
    global D, C
    flt = sys.argv[1] if len(sys.argv) > 1 else ""
    D = Daemon()
    C = EngineClient(D.addr, timeout=60)
    try:
        C.initialize(preset="tiny")
        rc = run_tests([t for t in TESTS if flt in t.__name__])
    finally:
        C.close()
        code = D.stop()
    if code != 0:
        print("engined exited with %s" % code)
        rc = 1
    if rc:
        print(D.log_text()[-3000:])
    return rc


if __name__ == "__main__":
    sys.exit(main())
