"""ShareWeights, the same-host fast path (README "Same-host weights"): the
weights in a sealed memfd picked up over the daemon's unix socket.

The reference is the weight stream (GetPerTensorParam) of the same daemon:
every tensor of a share must have its name, dtype, shape and bytes, for
float32, bfloat16 and float16, for a subset of names in the order asked,
and after a training step (the share is the weights of the call, not a
stale copy). The rest: the file is sealed and the socket's mode is 0660, a
handle is good for its uses only, bad datagrams are answered and change
nothing, expired handles are refused, the bounds on pending shares, the
RPC's authentication, the path through engine_param_copy (CPU device in
discrete mode), torch views, a stale or busy socket path at start. A
bfloat16 share of most parameters is the engine's own bf16 copy, lent
without a copy: the same checks, and it must not change after a step.
Each test that needs its own settings starts its own daemon.
Run from the source root (meson runs it through run_py.sh):
ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_share.py [-k name]
"""
import fcntl
import gc
import mmap
import os
import re
import shutil
import socket
import stat
import subprocess
import time
import urllib.request

import grpc
import numpy as np
import pytest

from bf16_ref import expect_native_bf16_matmul, torch_bits
from daemon_fixture import Daemon, wait_for, make_tmp
from rpc_expect import expect

from engined_client import EngineClient, HAVE_ML_DTYPES, open_share
from engined_client.shared import receive_fd

SC = grpc.StatusCode
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
TOK_FULL = "alice-0123456789abcdef0123456789"
TOK_RO = "ci-ro-0123456789abcdef0123456789"


@pytest.fixture(scope="module")
def tmp():
    d = make_tmp(prefix="engined-share-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(tmp, name, *args, **kw):
    """A daemon whose share socket is tmp/name.sock."""
    return Daemon("--share-socket", os.path.join(tmp, name + ".sock"), *args, **kw)


@pytest.fixture(scope="module")
def sd(request, tmp):
    d = start(tmp, "main")
    failed = request.session.testsfailed
    try:
        yield d
    finally:
        code = d.stop()
        if code != 0 or request.session.testsfailed > failed:
            print("\n--- engined log (tail) ---\n" + d.log_text()[-4000:])
    assert code == 0
    assert not os.path.exists(os.path.join(tmp, "main.sock")), "socket file left behind"


@pytest.fixture(scope="module")
def c(sd):
    with EngineClient(sd.addr, timeout=120) as cl:
        cl.initialize(preset="tiny", seed=5, optimizer={"lr": 1e-2})
        yield cl


def streamed(c, dtype="float32", names=None):
    return [(n, a) for n, a in c.stream_weights(dtype=dtype, names=names)]


def same(shared, ref):
    """Every tensor of ref in shared, in ref's order, bit for bit."""
    assert list(shared) == [n for n, _ in ref]
    for n, a in ref:
        b = shared[n]
        assert b.dtype == a.dtype and b.shape == a.shape, n
        assert b.tobytes() == a.tobytes(), n


def train_step(c):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 1024, 24).astype(np.int32)
    c.forward_backward(ids, [10, 14], loss="sft")
    return c.optimizer_step()


# --- what a share holds --------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_share_is_the_stream_bit_for_bit(c, dtype):
    ref = streamed(c, dtype)
    with c.share_weights(dtype=dtype) as w:
        same(w, ref)
        assert len(w) == len(ref) > 30
        assert w.step == c.get_status().step
        if dtype == "bfloat16":
            assert w["model.norm.weight"].dtype == (np.dtype("bfloat16") if HAVE_ML_DTYPES
                                                    else np.uint16)
        # The views are read-only numpy arrays over the mapping.
        a = w["model.embed_tokens.weight"]
        assert not a.flags.writeable and not a.flags.owndata
        with pytest.raises(ValueError):
            a[0, 0] = 1


def test_layout_offsets_are_aligned_and_gaps_zero(c):
    """A copied share's layout (float16 is always copied)."""
    t = c.request_share(dtype="float16")
    fd = receive_fd(t.socket_path, t.handle)
    try:
        assert os.fstat(fd).st_size == t.total_bytes
        raw = mmap.mmap(fd, t.total_bytes, prot=mmap.PROT_READ)
        end = 0
        for x in t.tensors:
            assert x.offset % 64 == 0 and x.offset >= end
            assert raw[end:x.offset] == bytes(x.offset - end)
            end = x.offset + x.bytes
        assert end == t.total_bytes
        raw.close()
    finally:
        os.close(fd)


def test_names_subset_in_the_order_asked(c):
    names = ["model.norm.weight", "model.layers.1.mlp.down_proj.weight",
             "model.embed_tokens.weight"]
    for dtype in ("float32", "bfloat16"):
        ref = streamed(c, dtype, names)
        with c.share_weights(dtype=dtype, names=names) as w:
            same(w, ref)
            assert list(w) == names


def test_after_a_training_step_the_share_is_new(c):
    with c.share_weights() as before_share:
        before = {n: np.array(a) for n, a in before_share.items()}
    s = train_step(c)
    assert s.step >= 1
    ref = streamed(c)
    with c.share_weights() as w:
        same(w, ref)
        assert w.step == s.step
        assert any(not np.array_equal(before[n], w[n]) for n in w)
    # bf16 after the step too.
    with c.share_weights(dtype="bfloat16") as w:
        same(w, streamed(c, "bfloat16"))


def test_a_share_is_a_snapshot(c):
    """The memory of a share taken before a step does not change with it."""
    with c.share_weights(dtype="bfloat16") as w:
        first = {n: a.tobytes() for n, a in w.items()}
        train_step(c)
        assert {n: a.tobytes() for n, a in w.items()} == first
        with c.share_weights(dtype="bfloat16") as w2:
            assert any(w2[n].tobytes() != first[n] for n in first)


def test_torch_views(c):
    torch = pytest.importorskip("torch")
    ref = dict(c.stream_weights(dtype="bfloat16", as_torch=True))
    with c.share_weights(dtype="bfloat16", as_torch=True) as w:
        assert list(w) == list(ref)
        for n, t in ref.items():
            assert w[n].dtype == torch.bfloat16 and w[n].shape == t.shape
            assert torch.equal(w[n].view(torch.int16), t.view(torch.int16)), n
        # An in-place op writes a private copy: no crash, the share is sealed.
        w["model.norm.weight"].mul_(2)
        with c.share_weights(dtype="bfloat16", as_torch=True) as again:
            assert torch.equal(again["model.norm.weight"].view(torch.int16),
                               ref["model.norm.weight"].view(torch.int16))


def test_async_client_and_group(c, sd):
    import asyncio
    from engined_client import AsyncEngineClient, EngineGroup
    ref = streamed(c, "bfloat16")

    async def run():
        async with AsyncEngineClient(sd.addr, timeout=60) as ac:
            with await ac.share_weights(dtype="bfloat16") as w:
                same(w, ref)
            t = await ac.request_share(names=["model.norm.weight"], uses=2)
            with open_share(t) as a, open_share(t) as b:
                assert a["model.norm.weight"].tobytes() == b["model.norm.weight"].tobytes()
    asyncio.run(run())
    with EngineGroup([sd.addr], timeout=60) as g:
        with g.share_weights(dtype="bfloat16") as w:
            same(w, ref)


def test_close_keeps_live_views_valid(c):
    def mapped():
        with open("/proc/self/maps") as f:
            return sum("memfd:engined-weights" in line for line in f)
    gc.collect()
    base = mapped()
    w = c.share_weights()
    keep = w["model.norm.weight"]
    expect_bytes = keep.tobytes()
    w.close()
    assert w.closed and len(w) == 0
    with pytest.raises(ValueError):
        w["model.norm.weight"]
    assert keep.tobytes() == expect_bytes        # still mapped for the view
    assert mapped() == base + 1
    del keep
    gc.collect()
    assert mapped() == base                      # unmapped with the last view
    with c.share_weights() as w:
        pass
    assert mapped() == base                      # no view: unmapped at close


# --- the file and the socket ---------------------------------------------------------

def test_sealed_file_and_socket_mode(c, sd, tmp):
    path = os.path.join(tmp, "main.sock")
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    t = c.request_share(names=["model.norm.weight"])
    assert t.socket_path == path and len(t.handle) == 16
    fd = receive_fd(t.socket_path, t.handle)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            mmap.mmap(fd, t.total_bytes, flags=mmap.MAP_SHARED,
                      prot=mmap.PROT_READ | mmap.PROT_WRITE)
        assert os.readlink("/proc/self/fd/%d" % fd).startswith("/memfd:engined-weights")
    finally:
        os.close(fd)
    assert "handed to pid %d uid %d" % (os.getpid(), os.getuid()) in sd.log_text()


def test_a_handle_is_used_once(c):
    t = c.request_share()
    with open_share(t) as w:
        assert len(w) == len(t.tensors)
    e = expect(SC.NOT_FOUND, open_share, t)
    assert "unknown, used up or expired" in e.details()
    assert c.get_status().pending_shares == 0
    with c.share_weights(names=["model.norm.weight"]) as w:   # still serving
        assert list(w) == ["model.norm.weight"]


def test_uses_share_one_file(c):
    t = c.request_share(dtype="bfloat16", uses=3)
    st = c.get_status()
    assert (st.pending_shares, st.pending_share_bytes) == (1, t.total_bytes)
    fds = [receive_fd(t.socket_path, t.handle) for _ in range(2)]
    assert c.get_status().pending_shares == 1
    fds.append(receive_fd(t.socket_path, t.handle))
    try:
        inodes = {os.fstat(fd).st_ino for fd in fds}
        assert len(inodes) == 1                  # one copy in memory for all
    finally:
        for fd in fds:
            os.close(fd)
    st = c.get_status()
    assert (st.pending_shares, st.pending_share_bytes) == (0, 0)
    expect(SC.NOT_FOUND, receive_fd, t.socket_path, t.handle)


def datagram(path, data, fds=()):
    """Send one datagram to the share socket: the answer (b"" when closed)
    and the descriptors that came with it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(30)
    try:
        s.connect(path)
        if fds:
            socket.send_fds(s, [data], list(fds))
        else:
            s.send(data)
        msg, got, _, _ = socket.recv_fds(s, 512, 4)
        for fd in got:
            os.close(fd)
        return msg, len(got)
    finally:
        s.close()


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def test_bad_datagrams_are_refused(c, sd, tmp):
    path = os.path.join(tmp, "main.sock")
    t = c.request_share(names=["model.norm.weight"])
    before = fd_count(sd.proc.pid)
    msg, n = datagram(path, os.urandom(16))
    assert msg[0] == 1 and n == 0 and b"unknown, used up or expired" in msg
    msg, n = datagram(path, t.handle[:5])
    assert msg[0] == 2 and n == 0 and b"got 5 bytes" in msg
    msg, n = datagram(path, t.handle + b"x" * 100)
    assert msg[0] == 2 and b"got 116 bytes" in msg
    # A descriptor sent to the daemon is dropped, not kept.
    with open(os.devnull, "rb") as f:
        msg, n = datagram(path, t.handle, fds=[f.fileno()] * 3)
    assert msg[0] == 2 and b"ancillary data" in msg
    # The empty datagram reads as a peer that left: closed without an answer.
    assert datagram(path, b"")[0] == b""
    wait_for(lambda: fd_count(sd.proc.pid) <= before, "the daemon to close its connections")
    # None of these spent the handle; nothing changed.
    with open_share(t) as w:
        assert w["model.norm.weight"].tobytes() == streamed(
            c, names=["model.norm.weight"])[0][1].tobytes()
    assert c.get_status().pending_shares == 0


def test_idle_connections_are_bounded_and_closed(c, tmp):
    """An idle connection does not hold up others; SHARE_SOCKET_MAX_CONNS
    idle ones make the next wait in the backlog until the daemon closes
    them at SHARE_SOCKET_TIMEOUT_MS (5 s)."""
    path = os.path.join(tmp, "main.sock")
    one = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    one.connect(path)
    with c.share_weights(names=["model.norm.weight"]) as w:
        assert len(w) == 1
    idle = [one]
    for _ in range(15):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(path)
        idle.append(s)
    t = c.request_share(names=["model.norm.weight"])
    with open_share(t, timeout=60) as w:         # waits for a free slot
        assert len(w) == 1
    for s in idle:
        s.settimeout(60)
        assert s.recv(16) == b""                 # closed by the daemon
        s.close()


def test_not_configured(tmp):
    d = Daemon()
    try:
        with EngineClient(d.addr, timeout=60) as cl:
            cl.initialize(preset="tiny")
            expect(SC.FAILED_PRECONDITION, cl.share_weights, field="share_socket")
            expect(SC.FAILED_PRECONDITION, cl.request_share, field="[server] share_socket")
    finally:
        assert d.stop() == 0


def test_bad_requests(c):
    expect(SC.INVALID_ARGUMENT, c.request_share, dtype=4, field="dtype")
    expect(SC.INVALID_ARGUMENT, c.request_share, names=[""], field="names[0]")
    expect(SC.NOT_FOUND, c.request_share, names=["model.norm.weight", "nope"],
           field="names[1]: no parameter 'nope'")
    expect(SC.INVALID_ARGUMENT, c.request_share,
           names=["model.norm.weight", "model.embed_tokens.weight", "model.norm.weight"],
           field="names[2]: 'model.norm.weight' given twice")
    names = [name for name, _ in streamed(c)]
    expect(SC.INVALID_ARGUMENT, c.request_share, names=names + ["model.norm.weight"],
           field="names: %d names, the engine has %d parameters" % (len(names) + 1, len(names)))
    expect(SC.INVALID_ARGUMENT, c.request_share, uses=1025, field="uses")
    expect(SC.INVALID_ARGUMENT, c.request_share, uses=-1, field="uses")
    assert c.get_status().pending_shares == 0


# --- lifetime and bounds --------------------------------------------------------

def test_expired_handles_are_refused(tmp, c):
    # Pending until picked up (the module's daemon: the default 60 s ttl,
    # so that no step below races the clock).
    before = c.get_status().pending_shares
    t = c.request_share(names=["model.norm.weight"])
    assert c.get_status().pending_shares == before + 1
    with open_share(t) as w:
        assert len(w) == 1
    assert c.get_status().pending_shares == before
    # With a 0.5 s ttl an unclaimed share expires and its handle is refused.
    d = start(tmp, "ttl", "-o", "server.share_ttl_s=0.5")
    try:
        with EngineClient(d.addr, timeout=60) as cl:
            expect(SC.FAILED_PRECONDITION, cl.share_weights, field="not initialized")
            cl.initialize(preset="tiny")
            t = cl.request_share()
            assert t.expires_in_s == 0.5
            wait_for(lambda: time.sleep(0.05) or cl.get_status().pending_shares == 0,
                     "the share to expire")
            assert cl.get_status().pending_share_bytes == 0
            expect(SC.NOT_FOUND, open_share, t)
    finally:
        assert d.stop() == 0
    assert "share #1 expired unclaimed after 0.5 s" in d.log_text()


def test_pending_bounds(tmp):
    d = start(tmp, "bounds", "-o", "server.max_shares=2", "-o", "server.max_share_bytes=5M",
              "--metrics-listen", "127.0.0.1:0")
    try:
        with EngineClient(d.addr, timeout=60) as cl:
            cl.initialize(preset="tiny")            # 3.67 MB of fp32 weights
            big = cl.request_share()
            e = expect(SC.RESOURCE_EXHAUSTED, cl.request_share, field="server.max_share_bytes")
            assert "%d bytes of shares waiting" % big.total_bytes in e.details()
            small = cl.request_share(names=["model.norm.weight"])
            expect(SC.RESOURCE_EXHAUSTED, cl.request_share, names=["model.embed_tokens.weight"],
                   field="server.max_shares = 2")
            st = cl.get_status()
            assert (st.pending_shares, st.pending_share_bytes) == (
                2, big.total_bytes + small.total_bytes)
            port = re.search(r"metrics on http://\S+ \(port (\d+)[;)]", d.log_text()).group(1)
            page = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port,
                                          timeout=30).read().decode()
            assert "engined_shares_pending 2\n" in page
            assert "engined_share_bytes_pending %d\n" % (
                big.total_bytes + small.total_bytes) in page
            with open_share(big):
                pass
            with cl.share_weights(dtype="bfloat16") as w:   # room again
                assert len(w) == len(big.tensors)
    finally:
        assert d.stop() == 0


def test_engine_param_copy_path(tmp):
    """Parameters in (simulated) device memory: every slice through the
    engine's param copy, on the engine thread."""
    d = start(tmp, "discrete", env={"ENGINED_CPU_DISCRETE": "1"})
    try:
        with EngineClient(d.addr, timeout=60) as cl:
            cl.initialize(preset="tiny", seed=2)
            train_step(cl)
            for dtype in ("float32", "bfloat16"):
                with cl.share_weights(dtype=dtype) as w:
                    same(w, streamed(cl, dtype))
                    assert "copied" in share_line(d)   # nothing to lend
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("bf16_matmul", [True, False])
def test_bf16_from_the_engines_copy(tmp, bf16_matmul):
    """The engine keeps its weights rounded to bf16: bf16 matmuls do (AdamW
    refreshes the copy in its own pass), and an fp32 engine makes the copy
    at its first bfloat16 export of at least half of its weights. The
    bfloat16 stream sends that copy in place (no conversion; its debug
    line says so) and a share lends it; a stream of fewer tensors sends it
    too when it is current, else converts (one conversion is not worth a
    copy of every weight).
    All must be the float32 weights rounded to nearest even: at the start,
    after two training steps, after a checkpoint load (the copy is stale
    until the next export makes it again)."""
    d = start(tmp, "copy-%d" % bf16_matmul, "--log-level", "debug")

    def check(cl, few_how):
        ref = streamed(cl)
        few = ["model.norm.weight", "model.layers.0.self_attn.q_proj.weight"]
        part = streamed(cl, "bfloat16", few)
        assert "BFLOAT16, " + few_how in last_stream(d)
        assert all(np.array_equal(a.view(np.uint16), torch_bits(dict(ref)[n]))
                   for n, a in part)
        bf = streamed(cl, "bfloat16")
        assert "BFLOAT16, sent in place" in last_stream(d)
        assert [n for n, _ in bf] == [n for n, _ in ref]
        for (n, a), (_, b) in zip(ref, bf):
            assert np.array_equal(b.view(np.uint16), torch_bits(a)), n
        with cl.share_weights(dtype="bfloat16") as w:
            same(w, bf)
            assert "lent (the engine's bf16 copy)" in share_line(d)

    try:
        with EngineClient(d.addr, timeout=60) as cl:
            cl.initialize(preset="tiny", seed=4, optimizer={"lr": 1e-2},
                          bf16_matmul=bf16_matmul)
            how = cl.get_status().matmul
            if not bf16_matmul:
                assert how.startswith("fp32 (oneDNN "), how
            else:
                assert how.startswith("bf16 operands, fp32 accumulation ("), how
                assert ("emulated" not in how) == expect_native_bf16_matmul(), how
            assert "matmul: " + how in d.log_text()
            cl.set_mode("train")
            check(cl, "converted")          # no copy yet
            cl.save_checkpoint("pre")
            train_step(cl)
            check(cl, "sent in place")      # AdamW refreshed it
            train_step(cl)
            check(cl, "sent in place")
            cl.load_checkpoint("pre")
            check(cl, "converted")          # stale
    finally:
        assert d.stop() == 0


def last_stream(d):
    """The daemon's debug line of its last weight stream."""
    return [ln for ln in d.log_text().splitlines() if "stream: " in ln][-1]


def share_line(d):
    """The daemon's log line of its last share."""
    return [ln for ln in d.log_text().splitlines()
            if re.search(r"share #\d+: \d+ tensors, ", ln)][-1]


def raw_tensors(fd, t):
    """name -> the bytes of each tensor of ticket t in the file fd."""
    m = mmap.mmap(fd, t.total_bytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    try:
        return {x.name: m[x.offset:x.offset + x.bytes] for x in t.tensors}
    finally:
        m.close()


def test_bf16_shares_lend_the_engines_copy(tmp):
    """A bfloat16 share of at least half of the parameters' elements is the
    engine's own bf16 copy, lent: no copy is made (the log says "lent"),
    it holds the float32 weights rounded to nearest even (torch's rounding)
    at the ticket's offsets, sealed as every share; two shares with no step
    between are one file; a step writes a new copy and the lent file keeps
    its bytes; a share of less than half is copied into a file of its own.
    An fp32 engine keeps the copy current from its first lend: its
    bfloat16 stream then sends it in place."""
    d = start(tmp, "lend", "--log-level", "debug")

    def check(cl, fd, t):
        ref = dict(streamed(cl))
        got = raw_tensors(fd, t)
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
        assert os.fstat(fd).st_size == t.total_bytes
        for x in t.tensors:
            assert got[x.name] == torch_bits(ref[x.name]).tobytes(), x.name

    try:
        with EngineClient(d.addr, timeout=60) as cl:
            cl.initialize(preset="tiny", seed=6, optimizer={"lr": 1e-2})
            sizes = {n: a.size for n, a in streamed(cl)}
            total = sum(sizes.values())
            big, n_big = [], 0
            for n in sorted(sizes, key=sizes.get, reverse=True):
                if 2 * n_big < total:
                    big.append(n)
                    n_big += sizes[n]
            small = [n for n in sizes if n not in big]
            assert 2 * sum(sizes[n] for n in small) < total <= 2 * n_big

            t1 = cl.request_share(dtype="bfloat16")
            assert "lent (the engine's bf16 copy)" in share_line(d)
            assert t1.total_bytes == 2 * total
            fd1 = receive_fd(t1.socket_path, t1.handle)
            check(cl, fd1, t1)
            first = raw_tensors(fd1, t1)
            bf = streamed(cl, "bfloat16")
            assert "BFLOAT16, sent in place" in last_stream(d)
            assert all(first[n] == a.view(np.uint16).tobytes() for n, a in bf)

            t2 = cl.request_share(dtype="bfloat16", names=big)
            assert "lent" in share_line(d)
            fd2 = receive_fd(t2.socket_path, t2.handle)
            assert os.fstat(fd2).st_ino == os.fstat(fd1).st_ino
            assert all(x.offset % 64 == 0 for x in t1.tensors)
            off1 = {x.name: x.offset for x in t1.tensors}
            assert all(x.offset == off1[x.name] for x in t2.tensors)
            os.close(fd2)

            t3 = cl.request_share(dtype="bfloat16", names=small)
            assert "copied" in share_line(d)
            fd3 = receive_fd(t3.socket_path, t3.handle)
            assert os.fstat(fd3).st_ino != os.fstat(fd1).st_ino
            assert raw_tensors(fd3, t3) == {n: first[n] for n in small}
            os.close(fd3)

            train_step(cl)
            t4 = cl.request_share(dtype="bfloat16")
            assert "lent" in share_line(d)
            fd4 = receive_fd(t4.socket_path, t4.handle)
            assert os.fstat(fd4).st_ino != os.fstat(fd1).st_ino
            check(cl, fd4, t4)
            assert raw_tensors(fd1, t1) == first
            assert raw_tensors(fd4, t4) != first
            os.close(fd4)
            os.close(fd1)
            streamed(cl, "bfloat16")
            assert "BFLOAT16, sent in place" in last_stream(d)
    finally:
        assert d.stop() == 0


# --- authentication ---------------------------------------------------------------

def test_tokens(tmp):
    tf = os.path.join(tmp, "tokens")
    with open(tf, "w") as f:
        f.write("alice:%s\nci:%s read-only\n" % (TOK_FULL, TOK_RO))
    os.chmod(tf, 0o600)
    d = start(tmp, "tokens", "--token-file", tf)
    try:
        with EngineClient(d.addr, timeout=60, token=TOK_FULL) as full:
            full.initialize(preset="tiny")
        with EngineClient(d.addr, timeout=60) as anon:
            expect(SC.UNAUTHENTICATED, anon.share_weights, field="authorization")
        with EngineClient(d.addr, timeout=60, token="x" * len(TOK_FULL)) as bad:
            expect(SC.UNAUTHENTICATED, bad.request_share, field="authorization")
        with EngineClient(d.addr, timeout=60, token=TOK_RO) as ro:
            with ro.share_weights(names=["model.norm.weight"]) as w:  # reads weights
                assert len(w) == 1
            assert ro.get_status().pending_shares == 0
    finally:
        assert d.stop() == 0
    assert "identity=token:ci" in d.log_text()


# --- the socket path at start and stop ---------------------------------------------

def test_socket_path_at_start(tmp):
    path = os.path.join(tmp, "start.sock")
    bin_path = os.environ.get("ENGINED_BIN", "build/daemon/engined")
    # A stale socket of a daemon that died is replaced.
    d = Daemon("--share-socket", path)
    d.proc.kill()
    d.proc.wait()
    d.log.close()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    d = Daemon("--share-socket", path)
    try:
        assert "replaced the stale socket file" in d.log_text()
        # A second daemon on a live socket refuses to start.
        r = subprocess.run([bin_path, "--listen", "127.0.0.1:0", "--share-socket", path,
                            "--checkpoint-root", os.path.join(d.tmp, "checkpoints"),
                            "--model-root", os.path.join(d.tmp, "models")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "another process serves it" in r.stderr
        with EngineClient(d.addr, timeout=60) as cl:
            cl.initialize(preset="tiny")
            with cl.share_weights(names=["model.norm.weight"]) as w:
                assert len(w) == 1
    finally:
        assert d.stop() == 0
    assert not os.path.exists(path)
    # Not a socket: left alone, the daemon does not start.
    with open(path, "w") as f:
        f.write("keep me")
    r = subprocess.run([bin_path, "--listen", "127.0.0.1:0", "--share-socket", path,
                        "--checkpoint-root", os.path.join(tmp, "ck"),
                        "--model-root", os.path.join(tmp, "models")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "exists and is not a socket" in r.stderr
    assert open(path).read() == "keep me"
    # A relative path is a configuration error.
    r = subprocess.run([bin_path, "-o", "server.share_socket=rel.sock"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "must be an absolute path" in r.stderr


def test_adapter_views(tmp):
    """A LoRA adapter's three views (adapter, base, merged) through a share:
    each the stream of the same view bit for bit, the step the adapter's;
    the merged weights W + (alpha / r) B A of the other two views (float64
    reference); adapter_view without an adapter and an unknown adapter
    refused by field (tokens limited to adapters: test_adapters.py, the
    same rule for every method that names one)."""
    d = start(tmp, "lora")
    try:
        with EngineClient(d.addr, timeout=60) as cl:
            cl.initialize(preset="tiny", seed=2, frozen_base=True,
                          optimizer={"lr": 1e-2, "weight_decay": 0.0})
            cl.create_adapter("a", rank=4, alpha=8, target_modules="all-linear", seed=3)
            rng = np.random.default_rng(3)
            cl.forward_backward(rng.integers(0, 1024, 24).astype(np.int32), [10, 14],
                                loss="sft", adapter="a")
            assert cl.optimizer_step(adapter="a").step == 1
            views = {}
            for view in ("adapter", "base", "merged"):
                for dtype in ("float32", "bfloat16"):
                    ref = [(n, a) for n, a in cl.stream_weights(
                        dtype=dtype, adapter="a", adapter_view=view)]
                    with cl.share_weights(dtype=dtype, adapter="a", adapter_view=view) as w:
                        same(w, ref)
                        assert w.step == 1
                views[view] = {n: np.array(a) for n, a in cl.stream_weights(
                    adapter="a", adapter_view=view)}
            ad, base, merged = views["adapter"], views["base"], views["merged"]
            q = "model.layers.1.self_attn.q_proj"
            assert q + ".base_layer.weight" in base and q + ".weight" in merged
            pre = "base_model.model." + q
            A = ad[pre + ".lora_A.weight"].astype(np.float64)
            B = ad[pre + ".lora_B.weight"].astype(np.float64)
            assert np.abs(B).max() > 0   # trained: the merge is not the base
            want = base[q + ".base_layer.weight"].astype(np.float64) + 2.0 * B @ A
            assert np.abs(merged[q + ".weight"] - want).max() < 1e-6
            assert np.array_equal(merged["model.norm.weight"], base["model.norm.weight"])
            expect(SC.INVALID_ARGUMENT, cl.share_weights, adapter_view="merged",
                   field="adapter_view")
            expect(SC.NOT_FOUND, cl.share_weights, adapter="nope", field="adapter")
    finally:
        assert d.stop() == 0
