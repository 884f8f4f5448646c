"""engined's configuration: the INI file, --check-config, errors naming the
key and the line, command-line overrides, several listen addresses, and
the limits (max_concurrent_calls, default_deadline_s) and engine defaults
that the file sets, each observed on a real daemon.

Each test starts its own daemons; the `confdir` fixture is a directory the
module's tests share. Run from the source root (meson runs it through
run_py.sh): ENGINED_BIN=build/daemon/engined
PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_config.py [-k name]
"""
import os
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest

from daemon_fixture import Daemon, wait_for, make_tmp
from rpc_expect import expect

from engined_client import EngineClient

SC = grpc.StatusCode


@pytest.fixture(scope="module")
def confdir():
    """A directory for the module's configuration files."""
    return make_tmp(prefix="engined-config-")


def engined(*args):
    return subprocess.run([os.environ["ENGINED_BIN"]] + list(args), capture_output=True,
                          text=True, timeout=30)


def conf(confdir, name, text):
    path = os.path.join(confdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path



GOOD = """\
; a comment
# another
[server]
listen = 127.0.0.1:0
listen = unix:%(tmp)s/engined.sock
pollers = 2
max_request_bytes = 16M     ; inline comment
max_concurrent_calls = 2
default_deadline_s = 0.5

[paths]
checkpoint_root = %(tmp)s/ck
model_root = %(tmp)s/models

[engine]
threads = 2
param_offload = yes
max_tokens_per_micro_batch = 128

[log]
level = debug

[shutdown]
grace_s = 7.5
"""


def test_check_config_ok_and_effective_values(confdir):
    path = conf(confdir, "good.conf", GOOD % {"tmp": confdir})
    p = engined("--check-config", path)
    assert p.returncode == 0, p.stderr
    assert "configuration OK" in p.stderr
    out = p.stdout
    for line in ["listen = 127.0.0.1:0", "listen = unix:%s/engined.sock" % confdir,
                 "pollers = 2", "max_request_bytes = 16777216",
                 "max_send_bytes = 67108864", "default_deadline_s = 0.5",
                 "param_offload = true", "optimizer_offload = false", "level = debug",
                 "grace_s = 7.5", "max_tokens_per_micro_batch = 128"]:
        assert "\n" + line + "\n" in out, (line, out)
    # The command line overrides the file; the first --listen replaces the
    # file's addresses, later ones add.
    p = engined("--check-config", path, "--pollers", "3", "-o", "log.level=warn",
                "--listen", "127.0.0.1:7001", "--listen", "localhost:7002")
    assert p.returncode == 0, p.stderr
    assert "\npollers = 3\n" in p.stdout and "\nlevel = warn\n" in p.stdout
    assert "listen = 127.0.0.1:7001\nlisten = localhost:7002\n" in p.stdout
    assert "engined.sock" not in p.stdout
    # --check-config does not start anything nor create the roots.
    assert not os.path.exists(os.path.join(confdir, "ck"))


def test_errors_name_key_and_line(confdir):
    cases = [
        ("[server]\npollers = 2\n\n[engine]\nthreads = lots\n",
         "bad.conf:5: [engine] threads: 'lots' is not an integer in [0, 1024]"),
        ("[server]\nlisten = 127.0.0.1:1\nfrobnicate = 1\n",
         "bad.conf:3: [server] frobnicate: unknown key"),
        ("[servre]\nlisten = 127.0.0.1:1\n",
         "bad.conf:2: [servre] listen: unknown section 'servre'"),
        ("[server]\npollers = 2\npollers = 3\n",
         "bad.conf:3: [server] pollers: given twice (first on line 2)"),
        ("[server]\nlisten = 127.0.0.1:99999\n",
         "bad.conf:2: [server] listen: '127.0.0.1:99999' is not host:port"),
        ("[server]\ninsecure = maybe\n",
         "bad.conf:2: [server] insecure: 'maybe' is not a boolean"),
        ("[server]\nmax_request_bytes = 12Q\n",
         "bad.conf:2: [server] max_request_bytes: '12Q' is not a size"),
        ("[shutdown]\ngrace_s = -1\n",
         "bad.conf:2: [shutdown] grace_s: '-1' is not a number of seconds"),
        ("[shutdown]\nsave_on_stop = ../out\n",
         "bad.conf:2: [shutdown] save_on_stop: '../out' must be a relative path"),
        ("[log]\nlevel = loud\n",
         "bad.conf:2: [log] level: 'loud' is not one of error, warn, info, debug"),
        ("pollers = 1\n", "bad.conf:1: pollers: key outside a [section]"),
        ("[server]\nthis line has no equals sign\n", "bad.conf:2: syntax error"),
        ("[metrics]\nlisten = nowhere\n",
         "bad.conf:2: [metrics] listen: 'nowhere' is not host:port"),
        ("[paths]\nmodel_root = /x/" + "a" * 300 + "\n",
         "bad.conf:2: line longer than"),
        ("[tls]\ncert = /etc/x.pem\n", "[tls] key: missing"),
    ]
    for text, want in cases:
        path = conf(confdir, "bad.conf", text)
        p = engined("--check-config", path)
        assert p.returncode == 1, (text, p.returncode, p.stderr)
        assert want in p.stderr, (want, p.stderr)
    p = engined("--check-config", os.path.join(confdir, "missing.conf"))
    assert p.returncode == 1 and "missing.conf: cannot open" in p.stderr
    p = engined("--config", conf(confdir, "ok.conf", "[log]\nlevel = info\n"),
                "-o", "log.volume=3")
    assert p.returncode == 1 and "-o log.volume=3: [log] volume: unknown key" in p.stderr
    p = engined("--pollers", "0")
    assert p.returncode == 1 and "[server] pollers: '0'" in p.stderr
    p = engined("--no-such-flag")
    assert p.returncode == 2


def test_config_file_serves_tcp_and_unix(confdir):
    """The GOOD file on a real daemon: two addresses, its limits, its
    engine defaults."""
    tmp = make_tmp(prefix="engined-cfg-", dir=confdir)
    path = conf(confdir, "serve.conf", GOOD % {"tmp": tmp})
    d = Daemon("--config", path, listen=None, tmp=tmp)
    try:
        assert len(d.ports) == 1  # the unix socket has no port
        with EngineClient(d.addr, timeout=30) as c, \
                EngineClient("unix:%s/engined.sock" % tmp, timeout=30) as u:
            assert c.health() == "SERVING" and u.health() == "SERVING"
            c.initialize(replace=True, preset="tiny")
            assert u.get_status().initialized
            # engine.param_offload = yes: leaving TRAIN offloads the parameters.
            c.set_mode("train")
            assert c.set_mode("idle").placement.model is False
            # engine.max_tokens_per_micro_batch = 128 is the default budget.
            expect(SC.INVALID_ARGUMENT, c.forward_backward, np.zeros(256, np.int32), [256],
                   loss="sft", field="max_tokens_per_micro_batch 128")
            # server.max_request_bytes = 16M
            big = np.zeros(5 << 20, np.int32)
            expect(SC.RESOURCE_EXHAUSTED, c.forward_backward, big, [big.size], loss="sft")
    finally:
        assert d.stop() == 0
    log = d.log_text()
    assert "serving on 127.0.0.1:%d, unix:%s/engined.sock" % (d.port, tmp) in log, log


def test_limits_concurrent_calls_and_default_deadline(confdir):
    """max_concurrent_calls = 2: with one held job running and one queued, a
    third engine call is refused RESOURCE_EXHAUSTED (GetStatus is not an
    engine call). default_deadline_s = 0.1: a job without a deadline of its
    own still queued after 0.1 s is answered DEADLINE_EXCEEDED without
    running; one that started in time completes. The running job is held
    by the test hook until the queued one's deadline has passed."""
    tmp = make_tmp(prefix="engined-lim-", dir=confdir)
    d = Daemon("--config", conf(confdir, "lim.conf", GOOD % {"tmp": tmp}),
               "-o", "server.default_deadline_s=0.1", listen=None, tmp=tmp, hold=True)
    try:
        c = EngineClient(d.addr)  # no client deadline
        c.initialize(replace=True, preset="tiny")
        ids = np.arange(64, dtype=np.int32)
        out = {}

        def held_job():
            out["r"] = c.forward_backward(ids, [32, 32], loss="sft")

        d.hold()
        t = threading.Thread(target=held_job)
        t.start()
        wait_for(lambda: c.get_status().busy, "the job to start")
        res = {}

        def queued():
            try:
                c.optimizer_step()
                res["q"] = "OK"
            except grpc.RpcError as e:
                res["q"] = e.code()

        t2 = threading.Thread(target=queued)
        t2.start()
        wait_for(lambda: c.get_status().queued_jobs >= 1, "the second job to queue")
        expect(SC.RESOURCE_EXHAUSTED, c.lr_scheduler_step, field="max_concurrent_calls")
        st = c.get_status()
        assert st.busy and st.current_job == "ForwardBackward", st
        # The queued call arrived before it was seen queued: 0.2 s from now
        # its 0.1 s deadline has passed, however slow the machine.
        time.sleep(0.2)
        d.release()
        t.join()
        t2.join()
        assert "r" in out
        assert res["q"] == SC.DEADLINE_EXCEEDED, res
        assert c.get_status().step == 0  # it did not run
        # Released, the hook no longer holds anything: a call runs at once.
        c.forward_backward(ids, [32, 32], loss="sft")
        assert c.optimizer_step().step == 1
        c.close()
    finally:
        assert d.stop() == 0
    log = d.log_text()
    assert "deadline passed after" in log
    assert "test hook: ForwardBackward held until" in log


def test_default_device():
    d = Daemon("-o", "engine.default_device=tpu")
    try:
        with EngineClient(d.addr, timeout=30) as c:
            expect(SC.FAILED_PRECONDITION, c.initialize, preset="tiny", field="tpu")
            assert c.initialize(replace=True, preset="tiny", device="cpu").engine_key.endswith("/cpu")
    finally:
        assert d.stop() == 0
