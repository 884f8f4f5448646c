"""Path confinement of the real engined: checkpoint and model paths are
resolved by the kernel beneath their root (openat2 RESOLVE_BENEATH) and
pinned while the engine writes or reads. '..', absolute paths, symlinks
out of the root (to /etc, to a directory outside) are refused
PERMISSION_DENIED; a symlink inside the root is fine; and a directory
swapped for a symlink to the outside while saves run redirects nothing:
every byte lands under the root. Below a directory the client names,
nothing is opened through a symlink: a `latest` entry, `latest` itself,
each checkpoint file and each file of a model_path that is a symlink is
PERMISSION_DENIED naming it (the targets outside are valid copies, so a
followed link would have loaded); saves replace planted symlinks (latest,
stale temporaries, files of an overwritten checkpoint) without writing or
removing anything they point to; rotation never follows one.

The tests share one daemon with an initialized engine (the `daemon` and
`client` fixtures). Run from the source root (meson runs it through
run_py.sh): ENGINED_BIN=build/daemon/engined
PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_paths.py [-k name]
"""
import hashlib
import json
import os
import shutil
import struct
import threading
import time

import grpc
import pytest

from daemon_fixture import make_tmp
from engined_client import EngineClient
from rpc_expect import expect

SC = grpc.StatusCode


@pytest.fixture(scope="module")
def client(daemon):
    """The shared daemon's client, its engine initialized (tiny preset)."""
    c = EngineClient(daemon.addr, timeout=60)
    try:
        c.initialize(replace=True, preset="tiny")
        yield c
    finally:
        c.close()



def files_under(path):
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        out += [os.path.join(dirpath, n) for n in dirnames + filenames]
    return out


def test_refused_paths(daemon, client):
    root = daemon.ckpt_root
    outside = make_tmp(prefix="engined-outside-")
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
    outside = make_tmp(prefix="engined-swap-outside-")
    run, real = os.path.join(root, "run"), os.path.join(root, "run.real")
    os.makedirs(run)
    stop = threading.Event()
    swaps = [0]
    strays = [0]

    def restore():
        # Put the real directory back at `run`. When the daemon made a
        # new `run` in the gap and wrote into it, park that one under the
        # root (run.stray-K) first, so the toggler can never get stuck.
        while os.path.lexists(real):
            try:
                if os.path.islink(run):
                    os.unlink(run)
                os.rename(real, run)
            except OSError:
                try:
                    os.rename(run, os.path.join(root, "run.stray-%d" % strays[0]))
                    strays[0] += 1
                except OSError:
                    pass

    def toggler():
        while not stop.is_set():
            try:
                os.rename(run, real)
                os.symlink(outside, run)
                swaps[0] += 1
                time.sleep(0.0005)
            except OSError:
                pass  # the daemon re-created `run` in the gap
            restore()
            time.sleep(0.0005)

    t = threading.Thread(target=toggler)
    t.start()
    codes = {}
    # The loop ends on counts, not on time: at least 20 saves while at
    # least 100 swaps ran, whatever the machine's speed. The deadline only
    # turns a toggler that stopped swapping into a failure, never a hang.
    deadline = time.time() + 120
    i = 0
    try:
        while (swaps[0] < 100 or i < 20) and time.time() < deadline:
            try:
                client.save_checkpoint("run/ck-%d" % i, global_step=i)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
                if e.code() != SC.PERMISSION_DENIED and not (
                        e.code() == SC.NOT_FOUND and VANISHED in e.details()):
                    codes.setdefault("messages", []).append(e.details())
            i += 1
    finally:
        stop.set()
        t.join()
    leaked = files_under(outside)
    assert leaked == [], "written outside the root: %r" % leaked[:10]
    assert set(codes) <= {"OK", "PERMISSION_DENIED", "NOT_FOUND"}, codes
    assert swaps[0] >= 100, swaps
    assert codes.get("OK", 0) >= 1, codes
    # Every successful save is a complete checkpoint somewhere under the root.
    saved = [p for p in files_under(root) if p.endswith("/engine_state.json") and "/ck-" in p]
    assert len(saved) >= codes["OK"], (len(saved), codes)
    print("%d saves: %s, %d swaps, %d strays" % (i, codes, swaps[0], strays[0]))


CKPT_FILES = ["model.safetensors", "optimizer.safetensors", "engine_state.json", "config.json"]


def snapshot(path):
    """Every file and symlink under path: relative name -> bytes (or link)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, path)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                out[rel] = open(p, "rb").read()
            else:
                out[rel] = "dir"
    return out


def weights_digest(client):
    h = hashlib.sha256()
    for name, arr in client.stream_weights():
        h.update(name.encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def test_checkpoint_symlinks_refused(daemon, client):
    """Loads that meet a symlink below the named directory are refused
    PERMISSION_DENIED naming it, and change nothing; saves never write or
    remove through a planted symlink."""
    root = daemon.ckpt_root
    assert client.save_checkpoint("sl/good", global_step=5).path == "sl/good"
    good = os.path.join(root, "sl", "good")
    outside = make_tmp(prefix="engined-sl-outside-")
    shutil.copytree(good, os.path.join(outside, "ck"))   # a valid checkpoint
    with open(os.path.join(outside, "latest-target"), "w") as f:
        f.write("ck")
    os.makedirs(os.path.join(outside, "tmp-target"))
    before = snapshot(outside)
    # Other weights in the engine, so that a followed link would show.
    client.initialize(replace=True, preset="tiny", seed=77)
    want = weights_digest(client)

    # `latest` naming an entry that is a symlink to the outside checkpoint.
    os.makedirs(os.path.join(root, "sl-latest"))
    with open(os.path.join(root, "sl-latest", "latest"), "w") as f:
        f.write("ck-out")
    os.symlink(os.path.join(outside, "ck"), os.path.join(root, "sl-latest", "ck-out"))
    e = expect(SC.PERMISSION_DENIED, client.load_checkpoint, "sl-latest", field="ck-out")
    assert "symlink" in e.details(), e.details()
    # `latest` itself a symlink (to a file naming a real checkpoint).
    os.makedirs(os.path.join(root, "sl-latest2"))
    shutil.copytree(good, os.path.join(root, "sl-latest2", "ck"))
    os.symlink(os.path.join(outside, "latest-target"), os.path.join(root, "sl-latest2", "latest"))
    expect(SC.PERMISSION_DENIED, client.load_checkpoint, "sl-latest2", field="latest")
    # Each checkpoint file a symlink to its identical copy outside.
    for name in CKPT_FILES:
        d = os.path.join(root, "sl", "f-" + name)
        shutil.copytree(good, d)
        os.unlink(os.path.join(d, name))
        os.symlink(os.path.join(outside, "ck", name), os.path.join(d, name))
        e = expect(SC.PERMISSION_DENIED, client.load_checkpoint, "sl/f-" + name,
                   field="sl/f-%s/%s" % (name, name))
        assert "symlink" in e.details(), e.details()
    # Through `latest` too (the checkpoint found by the tracker).
    with open(os.path.join(root, "sl", "latest"), "w") as f:
        f.write("f-model.safetensors")
    expect(SC.PERMISSION_DENIED, client.load_checkpoint, "sl", field="model.safetensors")
    assert weights_digest(client) == want
    assert client.get_status().step == 0

    # Saves: over a checkpoint holding a symlink (the old one is removed,
    # the link's target is not); through a planted `latest` symlink and
    # planted temporaries of the daemon's pid; rotation with a symlink to
    # a checkpoint outside in the parent.
    client.save_checkpoint("sl/f-model.safetensors", global_step=6)
    assert not os.path.islink(os.path.join(root, "sl", "f-model.safetensors",
                                           "model.safetensors"))
    wl = os.path.join(root, "wl")
    os.makedirs(wl)
    os.symlink(os.path.join(outside, "latest-target"), os.path.join(wl, "latest"))
    pid = daemon.proc.pid
    os.symlink(os.path.join(outside, "tmp-target"), os.path.join(wl, ".ck.tmp-%d" % pid))
    os.symlink(os.path.join(outside, "latest-target"), os.path.join(wl, ".latest.tmp-%d" % pid))
    os.symlink(os.path.join(outside, "ck"), os.path.join(wl, "zz-link"))
    client.save_checkpoint("wl/old", global_step=1)
    client.save_checkpoint("wl/ck", global_step=7, max_to_keep=1)
    assert not os.path.islink(os.path.join(wl, "latest"))
    assert open(os.path.join(wl, "latest")).read() == "ck"
    assert sorted(os.listdir(wl)) == ["ck", "latest", "zz-link"], os.listdir(wl)
    assert snapshot(outside) == before, "something outside the root changed"

    # Still serving: a valid save and load.
    assert client.load_checkpoint("wl/ck") == 7
    assert client.load_checkpoint("sl/good") == 5
    client.save_checkpoint("sl/after", global_step=8)
    assert client.load_checkpoint("sl/after") == 8
    shutil.rmtree(outside)


def safetensors_names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]


def test_model_path_symlinks_refused(daemon, client):
    """A model_path whose config.json, model.safetensors, index or shard is
    a symlink (to a valid copy outside) is PERMISSION_DENIED naming the
    file; the engine stays usable and a valid model_path loads."""
    ckpt, mroot = daemon.ckpt_root, daemon.model_root
    client.initialize(replace=True, preset="tiny", seed=5)
    client.save_checkpoint("for-model", global_step=1)
    src = os.path.join(ckpt, "for-model")
    outside = make_tmp(prefix="engined-model-outside-")
    for name in ["config.json", "model.safetensors"]:
        shutil.copy(os.path.join(src, name), os.path.join(outside, name))
    index = {"metadata": {}, "weight_map": {
        k: "model.safetensors" for k in safetensors_names(os.path.join(src, "model.safetensors"))}}
    with open(os.path.join(outside, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    before = snapshot(outside)

    def model_dir(name, links, index_file=False):
        d = os.path.join(mroot, name)
        os.makedirs(d)
        files = ["config.json", "model.safetensors"] + (
            ["model.safetensors.index.json"] if index_file else [])
        for f in files:
            if f in links:
                os.symlink(os.path.join(outside, f), os.path.join(d, f))
            else:
                shutil.copy(os.path.join(outside, f), os.path.join(d, f))

    model_dir("m-good", [])
    model_dir("m-config", ["config.json"])
    model_dir("m-weights", ["model.safetensors"])
    model_dir("m-index", ["model.safetensors.index.json"], index_file=True)
    model_dir("m-shard", ["model.safetensors"], index_file=True)
    for name, file in [("m-config", "config.json"), ("m-weights", "model.safetensors"),
                       ("m-index", "model.safetensors.index.json"),
                       ("m-shard", "model.safetensors")]:
        e = expect(SC.PERMISSION_DENIED, client.initialize, model_path=name,
                   field="%s/%s" % (name, file), replace=True)
        assert "symlink" in e.details(), e.details()
    assert snapshot(outside) == before
    # A sharded directory of real files loads, and so does the plain one.
    os.unlink(os.path.join(mroot, "m-shard", "model.safetensors"))
    shutil.copy(os.path.join(outside, "model.safetensors"),
                os.path.join(mroot, "m-shard", "model.safetensors"))
    client.initialize(replace=True, model_path="m-shard")
    client.initialize(replace=True, model_path="m-good")
    want = weights_digest(client)
    client.save_checkpoint("from-model", global_step=2)
    client.initialize(replace=True, preset="tiny", seed=6)
    assert client.load_checkpoint("from-model") == 2
    assert weights_digest(client) == want
    shutil.rmtree(outside)
