"""The daemon's bounds against callers who only hold a socket: request
bodies of callers without a valid token are never read (the daemon's peak
RSS stays far below the bytes sent; the body is asked for only once a call
is accepted), request bytes in flight are bounded
(server.max_inflight_request_bytes), a call with two `authorization`
headers is refused, and idle connections to the metrics port cannot keep
a scraper out (nor stay open past metrics.idle_timeout_s).

Each test starts its own daemon. Memory is compared against bounds computed
from the sizes sent, and held jobs (the test hook) replace any timing. Run
from the source root (meson runs it through run_py.sh):
ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_limits.py [-k name]
"""
import os
import re
import shutil
import socket
import urllib.request

import grpc
import pytest

from daemon_fixture import Daemon, wait_for, make_tmp
from rpc_expect import expect
from engined_client import EngineClient

SC = grpc.StatusCode
MiB = 1 << 20
TOKEN = "limits-0123456789abcdef0123456789"
SVC = "/engined.v1.TrainingEngine/"
# A channel of its own for each client (no connection shared between them).
OWN = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture
def token_file():
    tmp = make_tmp(prefix="engined-limits-")
    path = os.path.join(tmp, "tokens")
    with open(path, "w") as f:
        f.write("trainer:%s\n" % TOKEN)
    os.chmod(path, 0o600)
    yield path
    shutil.rmtree(tmp, ignore_errors=True)


def status_kib(pid, key):
    """A VmRSS / VmHWM line of /proc/PID/status, in KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError("%s not in /proc/%d/status" % (key, pid))


def padded(n, field=1000):
    """An empty request message carrying an unknown length-delimited field
    of n bytes: every method's request type parses it (protobuf keeps
    unknown fields), so it reaches the queue as any other request."""
    def varint(x):
        out = bytearray()
        while True:
            b = x & 0x7F
            x >>= 7
            out.append(b | (0x80 if x else 0))
            if not x:
                return bytes(out)
    return varint(field << 3 | 2) + varint(n) + bytes(n)


def metrics_port(d):
    m = re.search(r"metrics on http://\S+ \(port (\d+)[;)]", d.log_text())
    assert m, d.log_text()
    return int(m.group(1))


def scrape(port, timeout=30):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=timeout) as r:
        assert r.status == 200
        return r.read().decode()


def metric(port, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), scrape(port), re.M)
    assert m, "%s not on the page" % name
    return float(m.group(1))



# --- (A) bodies of unauthenticated calls are never read ------------------------

def test_unauthenticated_bodies_not_read(token_file):
    n, size = 4, 100 * MiB
    d = Daemon("--token-file", token_file, "-o", "server.max_request_bytes=128M")
    try:
        pid = d.proc.pid
        with EngineClient(d.addr, token=TOKEN, options=OWN) as c:
            assert c.get_status().version  # the daemon is up and warm
        rss0, hwm0 = status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM")
        body = padded(size)
        with EngineClient(d.addr, timeout=120, options=OWN) as c:
            futs = [c.channel.unary_unary(SVC + m).future(body, timeout=120)
                    for m in ("ForwardBackward", "GetStatus", "SaveCheckpoint",
                              "LrSchedulerStep")[:n]]
            for f in futs:
                e = f.exception()
                assert e is not None, "a call without a token succeeded"
                assert e.code() == SC.UNAUTHENTICATED, (e.code(), e.details())
                assert "missing" in e.details(), e.details()
            # An unknown method, too: refused before its body is read.
            e = expect(SC.UNAUTHENTICATED, c.channel.unary_unary("/foo.Bar/Baz"), body,
                       timeout=120)
        hwm1 = status_kib(pid, "VmHWM")
        growth = (hwm1 - max(hwm0, rss0)) * 1024
        print("peak RSS before %d KiB, after %d KiB: growth %.1f MiB for %d x %d MiB sent"
              % (hwm0, hwm1, growth / MiB, n + 1, size // MiB), flush=True)
        # Reading even one body would add 100 MiB; the rest is gRPC's
        # buffers and, under AddressSanitizer, its allocator (about 26 MiB).
        assert growth < size / 2, \
            "peak RSS grew %.1f MiB for requests refused without reading them" % (growth / MiB)
        # The daemon goes on serving callers with a token.
        with EngineClient(d.addr, token=TOKEN, options=OWN) as c:
            assert c.get_status().version
    finally:
        assert d.stop() == 0
    log = d.log_text()
    assert log.count("status=UNAUTHENTICATED") == n + 1, log[-3000:]


def test_inflight_request_bytes_bounded():
    size = 60 * MiB
    req = len(padded(size))
    d = Daemon("-o", "server.max_request_bytes=64M", "--metrics-listen", "127.0.0.1:0",
               "-o", "server.max_inflight_request_bytes=150M", hold=True)
    try:
        port = metrics_port(d)
        with EngineClient(d.addr, timeout=120, options=OWN) as c:
            c.initialize(replace=True, preset="tiny", seed=1)
            step = c.channel.unary_unary(SVC + "LrSchedulerStep")
            d.hold()
            # One job runs (held), one waits in the queue: 120 MiB in flight.
            first = step.future(padded(size), timeout=120)
            wait_for(lambda: "LrSchedulerStep held" in d.log_text(), "the held job")
            second = step.future(padded(size), timeout=120)
            wait_for(lambda: c.get_status().queued_jobs == 1, "the queued job")
            # A third would pass 150 MiB: refused, naming the setting.
            e = expect(SC.RESOURCE_EXHAUSTED, step, padded(size), timeout=120,
                       field="server.max_inflight_request_bytes")
            print("refused: %s" % e.details(), flush=True)
            assert ("a request of %d bytes with %d bytes of requests in flight"
                    % (req, 2 * req)) in e.details(), e.details()
            assert "= %d;" % (150 * MiB) in e.details(), e.details()
            assert metric(port, "engined_request_bytes_in_flight") == 2 * req
            # Small calls still fit.
            assert c.get_status().queued_jobs == 1
            d.release()
            assert first.result() is not None and second.result() is not None
            # Released with their replies: the next large ones fit again.
            for _ in range(2):
                step(padded(size), timeout=120)
            assert c.get_status().queued_jobs == 0
            assert metric(port, "engined_request_bytes_in_flight") == 0
    finally:
        assert d.stop() == 0


def test_inflight_bound_below_request_size_refused():
    tmp = make_tmp(prefix="engined-limits-")
    try:
        with pytest.raises(RuntimeError, match="max_inflight_request_bytes"):
            Daemon("-o", "server.max_request_bytes=64M",
                   "-o", "server.max_inflight_request_bytes=32M", tmp=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- (B) two authorization headers ---------------------------------------------

def test_two_authorization_headers_refused(token_file):
    d = Daemon("--token-file", token_file)
    try:
        with EngineClient(d.addr, timeout=20, options=OWN) as c:
            get = c.channel.unary_unary(SVC + "GetStatus")
            good = ("authorization", "Bearer " + TOKEN)
            assert get(b"", metadata=[good])
            for md in ([good, good], [good, ("authorization", "Bearer nope")],
                       [("authorization", "Bearer nope"), good]):
                expect(SC.UNAUTHENTICATED, get, b"", metadata=md,
                       field="authorization: more than one header")
    finally:
        assert d.stop() == 0
    assert d.log_text().count("more than one header") == 3


def test_call_without_a_message(token_file):
    """The body is asked for once the call is accepted: a client that
    half-closes without sending one gets INVALID_ARGUMENT, and without a
    token it is refused before that."""
    d = Daemon("--token-file", token_file)
    try:
        with EngineClient(d.addr, timeout=20, options=OWN) as c:
            none = c.channel.stream_unary(SVC + "GetStatus")
            expect(SC.INVALID_ARGUMENT, none, iter([]),
                   metadata=[("authorization", "Bearer " + TOKEN)],
                   field="request: no message")
            expect(SC.UNAUTHENTICATED, none, iter([]), field="missing")
    finally:
        assert d.stop() == 0


# --- (C) idle connections to the metrics port ----------------------------------

def metrics_limits(d):
    m = re.search(r"metrics on http://\S+ \(port (\d+); (\d+) connections, (\d+) per address",
                  d.log_text())
    assert m, d.log_text()
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def idle_socket(port, src, i):
    """A connection that sends nothing (even i) or half a request line."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    if i % 2:
        s.sendall(b"GET /metr")
    return s


def closed_by_server(s):
    try:
        return s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def n_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def n_open(socks):
    return sum(not closed_by_server(s) for s in socks)


def test_idle_metrics_connections_do_not_blind_the_scraper():
    # The idle timeout is far off: every socket the daemon did not close
    # on purpose stays open for the whole test.
    d = Daemon("--metrics-listen", "127.0.0.1:0", "-o", "metrics.idle_timeout_s=600")
    socks_a, socks_b = [], []
    try:
        port, total, per_addr = metrics_limits(d)
        print("limits: %d connections, %d per address" % (total, per_addr), flush=True)
        assert per_addr >= 8 and total >= 2 * per_addr
        fds0 = n_fds(d.proc.pid)
        # Another loopback address holds its full share, idle.
        socks_b = [idle_socket(port, "127.0.0.2", i) for i in range(per_addr)]
        # 64 idle connections from the scraper's own address.
        socks_a = [idle_socket(port, "127.0.0.1", i) for i in range(64)]
        assert "engined_uptime_seconds" in scrape(port, timeout=30)
        # The scrape came in while they were open: with 64 + 1 over the
        # per-address share the oldest idle ones made room, no others.
        keep = min(64, per_addr - 1)
        wait_for(lambda: n_open(socks_a) == keep, "%d of the 64 left open" % keep)
        assert n_open(socks_b) == per_addr
        # Far more idle connections than any limit: the scraper still gets in.
        socks_a += [idle_socket(port, "127.0.0.1", i) for i in range(total + 32)]
        for _ in range(3):
            assert "engined_uptime_seconds" in scrape(port, timeout=30)
        wait_for(lambda: n_open(socks_a) == per_addr - 1,
                 "%d of %d left open" % (per_addr - 1, len(socks_a)))
        assert n_open(socks_b) == per_addr
        # The closed ones are gone from the daemon too, not only half-closed.
        wait_for(lambda: n_fds(d.proc.pid) <= fds0 + 2 * per_addr,
                 "the daemon's descriptors back to %d + %d" % (fds0, 2 * per_addr))
        # gRPC is served all along.
        with EngineClient(d.addr, timeout=20, options=OWN) as c:
            assert c.get_status().version
        assert metric(port, "engined_uptime_seconds") > 0
    finally:
        for s in socks_a + socks_b:
            s.close()
        assert d.stop() == 0


def test_idle_metrics_connections_time_out():
    d = Daemon("--metrics-listen", "127.0.0.1:0", "-o", "metrics.idle_timeout_s=1")
    try:
        port = metrics_port(d)
        socks = [idle_socket(port, "127.0.0.1", i) for i in range(4)]
        wait_for(lambda: n_open(socks) == 0, "idle connections closed by the timeout")
        assert "engined_uptime_seconds" in scrape(port)
        for s in socks:
            s.close()
    finally:
        assert d.stop() == 0
