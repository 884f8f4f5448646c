"""Security of the real engined: TLS, mutual TLS, bearer tokens (full and
read-only), reload of certificates and tokens on SIGHUP while a stream
runs, the refusal to serve a non-loopback address without client
authentication, and the C client's (enginectl's) TLS and token options.

Certificates are made with openssl in a temporary directory (tls_util), once
for the module (the `cert` fixture); each test starts its own daemons.
Run from the source root (meson runs it through run_py.sh):
ENGINED_BIN=build/daemon/engined ENGINECTL_BIN=build/client/enginectl
PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_security.py [-k name]
"""
import os
import shutil
import signal
import subprocess
import time

import grpc
import pytest

from daemon_fixture import Daemon, make_tmp
from rpc_expect import expect
from tls_util import make_ca, make_cert

from engined_client import EngineClient

SC = grpc.StatusCode
TOK_FULL = "alice-0123456789abcdef0123456789"
TOK_RO = "ci-ro-0123456789abcdef0123456789"
TOK_ANON = "anonymous-token-0123456789abcdef"
TOK_NEW = "rotated-token-0123456789abcdef01"
# A channel of its own for each client: grpc may otherwise share one
# connection between channels, which would hide handshake failures.
OWN = [("grpc.use_local_subchannel_pool", 1)]



@pytest.fixture(scope="module")
def cert():
    """cert(name): the path of `name` in a temporary directory with every
    certificate, made for the module (the tests write token files there)."""
    certs = make_tmp(prefix="engined-certs-")
    t0 = time.time()
    for ca in ("ca1", "ca2", "ca3"):
        make_ca(certs, ca)
    make_cert(certs, "srv1", "ca1", "engined", server=True)
    make_cert(certs, "srv2", "ca1", "engined-other", server=True)
    make_cert(certs, "srv3", "ca3", "engined-rotated", server=True)
    make_cert(certs, "trainer", "ca1", "trainer", server=False)
    make_cert(certs, "mallory", "ca2", "mallory", server=False)
    print("certificates made in %.2f s" % (time.time() - t0), flush=True)
    yield lambda name: os.path.join(certs, name)
    shutil.rmtree(certs, ignore_errors=True)


def client(d, **kw):
    kw.setdefault("timeout", 20)
    return EngineClient(d.addr, options=OWN, **kw)


@pytest.fixture(scope="module")
def tls_client(cert):
    """tls_client(d, ca=..., client_cert=..., **kw): a TLS client of daemon d."""
    def make(d, ca="ca1.pem", client_cert=None, **kw):
        extra = {}
        if client_cert:
            extra = dict(certificate_chain=cert(client_cert + ".pem"),
                         private_key=cert(client_cert + ".key"))
        return client(d, root_certificates=cert(ca), server_name="localhost", **extra, **kw)
    return make


def write_tokens(path, lines):
    with open(path, "w") as f:
        f.write("# engined tokens\n\n" + "\n".join(lines) + "\n")
    os.chmod(path, 0o600)


def wait_log(d, text, timeout=10):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if text in d.log_text():
            return
        time.sleep(0.02)
    raise AssertionError("%r not in the log:\n%s" % (text, d.log_text()[-3000:]))


# --- TLS ---------------------------------------------------------------------

def test_tls(cert, tls_client):
    d = Daemon("--tls-cert", cert("srv1.pem"), "--tls-key", cert("srv1.key"))
    try:
        with tls_client(d) as c:
            assert c.get_status().version
            assert c.health() == "SERVING"
        # Plaintext against TLS, and TLS trusting another CA: no handshake.
        with client(d) as c:
            expect(SC.UNAVAILABLE, c.get_status, timeout=5)
        with tls_client(d, ca="ca2.pem") as c:
            expect(SC.UNAVAILABLE, c.get_status, timeout=5)
    finally:
        assert d.stop() == 0
    assert "(TLS)" in d.log_text()


def test_mutual_tls(cert, tls_client):
    d = Daemon("--tls-cert", cert("srv1.pem"), "--tls-key", cert("srv1.key"),
               "--tls-client-ca", cert("ca1.pem"))
    try:
        with tls_client(d, client_cert="trainer") as c:
            assert c.get_status().version
        # No client certificate; one signed by another CA.
        with tls_client(d) as c:
            expect(SC.UNAVAILABLE, c.get_status, timeout=5)
        with tls_client(d, client_cert="mallory") as c:
            expect(SC.UNAVAILABLE, c.get_status, timeout=5)
    finally:
        assert d.stop() == 0
    log = d.log_text()
    assert "rpc GetStatus peer=ipv4:127.0.0.1:" in log and "identity=cert:trainer" in log, log
    assert "mallory" not in log


# --- tokens ------------------------------------------------------------------

def test_tokens_full_and_read_only(cert):
    tf = cert("tokens")
    write_tokens(tf, ["alice:" + TOK_FULL, "ci:%s read-only" % TOK_RO, TOK_ANON + " full"])
    d = Daemon("--token-file", tf)
    try:
        with client(d) as c:
            expect(SC.UNAUTHENTICATED, c.get_status, field="missing")
            expect(SC.UNAUTHENTICATED, c.health, field="authorization")
            # Unknown methods: no hint for callers without a token.
            expect(SC.UNAUTHENTICATED, c.call_raw, "/foo.Bar/Baz", b"")
        with client(d, token="x" * len(TOK_FULL)) as c:
            expect(SC.UNAUTHENTICATED, c.get_status, field="not accepted")
        with client(d, token=TOK_FULL[:-1]) as c:
            expect(SC.UNAUTHENTICATED, c.get_status)
        with client(d, token=TOK_FULL + "0") as c:
            expect(SC.UNAUTHENTICATED, c.get_status)
        with client(d, token=TOK_RO) as ro, client(d, token=TOK_FULL) as full:
            assert ro.get_status().version and ro.health() == "SERVING"
            expect(SC.PERMISSION_DENIED, ro.initialize, preset="tiny", field="read-only")
            r = full.initialize(replace=True, preset="tiny", seed=1)
            ids = list(range(32))
            expect(SC.PERMISSION_DENIED, ro.forward_backward, ids, [32], loss="sft",
                   field="ForwardBackward")
            expect(SC.PERMISSION_DENIED, ro.save_checkpoint, "x")
            expect(SC.PERMISSION_DENIED, ro.optimizer_step)
            # Weights may be read with a read-only token.
            w = dict(ro.stream_weights())
            assert sum(a.size for a in w.values()) == r.num_parameters
            full.forward_backward(ids, [32], loss="sft")
            assert full.optimizer_step().step == 1
            expect(SC.UNIMPLEMENTED, full.call_raw, "/foo.Bar/Baz", b"")
        with client(d, token=TOK_ANON) as c:
            assert c.get_status().step == 1
    finally:
        assert d.stop() == 0
    log = d.log_text()
    assert "identity=token:alice status=OK" in log
    assert "rpc ForwardBackward peer=ipv4:127.0.0.1:" in log
    assert "identity=token:ci status=PERMISSION_DENIED" in log
    assert "identity=token:line-5 status=OK" in log  # the unnamed token
    for t in (TOK_FULL, TOK_RO, TOK_ANON):
        assert t not in log, "a token leaked into the log"


def test_health_exempt(cert):
    tf = cert("tokens-h")
    write_tokens(tf, ["alice:" + TOK_FULL])
    d = Daemon("--token-file", tf, "-o", "auth.health_exempt=true")
    try:
        with client(d) as c:
            assert c.health() == "SERVING"
            expect(SC.UNAUTHENTICATED, c.get_status)
    finally:
        assert d.stop() == 0


def test_token_file_refused(cert):
    tf = cert("tokens-bad")
    for lines, mode, what in [
            (["alice:" + TOK_FULL], 0o644, "readable or writable by others"),
            (["alice:short"], 0o600, "tokens-bad:3: token of 5 characters"),
            (["alice:%s admin" % TOK_FULL], 0o600, "tokens-bad:3: scope 'admin'"),
            (["a:" + TOK_FULL, "b:" + TOK_FULL], 0o600, "tokens-bad:4: same token as 'a'"),
            ([], 0o600, "no token")]:
        write_tokens(tf, lines)
        os.chmod(tf, mode)
        p = subprocess.run([os.environ["ENGINED_BIN"], "--listen", "127.0.0.1:0",
                            "--token-file", tf, "--checkpoint-root", cert("ck"),
                            "--model-root", cert("m")],
                           capture_output=True, text=True, timeout=20)
        assert p.returncode == 1, (p.returncode, p.stderr)
        assert what in p.stderr, (what, p.stderr)
        assert TOK_FULL not in p.stderr


def test_tls_files_refused(cert):
    for args, what in [
            (["--tls-cert", cert("srv1.pem"), "--tls-key", cert("srv2.key")],
             "tls.key: %s does not match" % cert("srv2.key")),
            (["--tls-cert", cert("srv1.pem")], "tls.cert and tls.key go together"),
            (["--tls-cert", cert("srv1.key"), "--tls-key", cert("srv1.key")],
             "tls.cert: no certificate"),
            (["--tls-cert", cert("srv1.pem"), "--tls-key", cert("nope.key")],
             "tls.key: cannot open"),
            (["--tls-client-ca", cert("ca1.pem")], "tls] client_ca")]:
        p = subprocess.run([os.environ["ENGINED_BIN"], "--listen", "127.0.0.1:0",
                            "--checkpoint-root", cert("ck"), "--model-root", cert("m")]
                           + args, capture_output=True, text=True, timeout=20)
        assert p.returncode == 1, (args, p.returncode, p.stderr)
        assert what in p.stderr, (what, p.stderr)


def test_non_loopback_refused(cert):
    base = [os.environ["ENGINED_BIN"], "--checkpoint-root", cert("ck"),
            "--model-root", cert("m"), "--listen", "127.0.0.1:0"]
    for addr in ["0.0.0.0:0", "[::]:0", ":0", "192.0.2.1:0", "example.com:50051"]:
        p = subprocess.run(base + ["--listen", addr], capture_output=True, text=True,
                           timeout=20)
        assert p.returncode == 1, (addr, p.stderr)
        assert "refusing to serve on non-loopback address '%s'" % addr in p.stderr, p.stderr
        assert "--insecure" in p.stderr and "token_file" in p.stderr
    # Loopback forms are fine; so is 0.0.0.0 with tokens, mutual TLS or --insecure.
    tf = cert("tokens-nl")
    write_tokens(tf, ["alice:" + TOK_FULL])
    for extra in (["--insecure"], ["--token-file", tf],
                  ["--tls-cert", cert("srv1.pem"), "--tls-key", cert("srv1.key"),
                   "--tls-client-ca", cert("ca1.pem")]):
        d = Daemon("--listen", "0.0.0.0:0", *extra)
        try:
            assert len(d.ports) == 2
        finally:
            assert d.stop() == 0
    # TLS without client authentication does not count.
    p = subprocess.run(base + ["--listen", "0.0.0.0:0", "--tls-cert", cert("srv1.pem"),
                               "--tls-key", cert("srv1.key")],
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 1 and "refusing" in p.stderr


# --- reload ------------------------------------------------------------------

def test_reload_on_sighup_while_streaming(cert, tls_client):
    """Certificates and tokens replaced + SIGHUP in the middle of a weight
    stream: the stream finishes intact over its connection; new
    connections see the new certificate (the old CA is refused) and only
    the new token works. A bad file on the next SIGHUP changes nothing."""
    d_dir = make_tmp(prefix="engined-reload-")
    crt, key, tf = (os.path.join(d_dir, n) for n in ("srv.pem", "srv.key", "tokens"))
    shutil.copy(cert("srv1.pem"), crt)
    shutil.copy(cert("srv1.key"), key)
    write_tokens(tf, ["alice:" + TOK_FULL])
    d = Daemon("--tls-cert", crt, "--tls-key", key, "--token-file", tf, tmp=d_dir)
    try:
        c = tls_client(d, token=TOK_FULL)
        ini = c.initialize(replace=True, preset="tiny", seed=5)
        ref = b"".join(b.data for b in c.get_per_tensor_param(bucket_bytes=1 << 20))
        it = c.get_per_tensor_param(bucket_bytes=4096)
        got = [next(it).data]
        # Rotate: a certificate from another CA, another token.
        shutil.copy(cert("srv3.pem"), crt)
        shutil.copy(cert("srv3.key"), key)
        write_tokens(tf, ["bob:" + TOK_NEW])
        d.signal(signal.SIGHUP)
        wait_log(d, "reload: TLS certificate /CN=engined-rotated")
        wait_log(d, "reload: 1 tokens")
        got += [b.data for b in it]
        assert b"".join(got) == ref and len(ref) == 4 * ini.num_parameters
        # The old connection is still up; the old token is not accepted.
        expect(SC.UNAUTHENTICATED, c.get_status)
        c.close()
        with tls_client(d, token=TOK_FULL) as c1:   # trusts the old CA only
            expect(SC.UNAVAILABLE, c1.get_status, timeout=5)
        with tls_client(d, ca="ca3.pem", token=TOK_FULL) as c2:
            expect(SC.UNAUTHENTICATED, c2.get_status)
        with tls_client(d, ca="ca3.pem", token=TOK_NEW) as c3:
            assert c3.get_status().initialized
            # A broken key and token file on the next SIGHUP: both refused,
            # the current ones stay.
            with open(key, "w") as f:
                f.write("-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
            write_tokens(tf, ["bob:short"])
            d.signal(signal.SIGHUP)
            wait_log(d, "the old certificates stay in force")
            wait_log(d, "the old tokens stay in force")
        with tls_client(d, ca="ca3.pem", token=TOK_NEW) as c4:
            assert c4.get_status().initialized
    finally:
        assert d.stop() == 0


# --- the C client (enginectl) ------------------------------------------------

def test_enginectl_tls_and_token(cert):
    tf = cert("tokens-c")
    write_tokens(tf, ["alice:" + TOK_FULL])
    tok = cert("client-token")
    with open(tok, "w") as f:
        f.write(TOK_FULL + "\n")
    d = Daemon("--tls-cert", cert("srv1.pem"), "--tls-key", cert("srv1.key"),
               "--tls-client-ca", cert("ca1.pem"), "--token-file", tf)
    ctl = os.environ["ENGINECTL_BIN"]
    base = [ctl, "--addr", d.addr, "--timeout", "10", "--tls-ca", cert("ca1.pem"),
            "--tls-server-name", "localhost"]
    mtls = ["--tls-cert", cert("trainer.pem"), "--tls-key", cert("trainer.key")]
    try:
        p = subprocess.run(base + mtls + ["--token-file", tok, "status"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and "initialized" in p.stdout, (p.stdout, p.stderr)
        env = dict(os.environ, ENGINED_TOKEN=TOK_FULL)
        p = subprocess.run(base + mtls + ["status"], capture_output=True, text=True,
                           timeout=30, env=env)
        assert p.returncode == 0, p.stderr
        p = subprocess.run(base + mtls + ["status"], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 1 and "UNAUTHENTICATED" in p.stderr, p.stderr
        p = subprocess.run(base + ["--token-file", tok, "status"], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 1 and "UNAVAILABLE" in p.stderr, p.stderr
    finally:
        assert d.stop() == 0
    assert "identity=token:alice,cert:trainer status=OK" in d.log_text()
