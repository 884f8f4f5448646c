"""engined under systemd's protocol, without systemd: the test binds its own
NOTIFY_SOCKET and reads what the daemon sends (READY=1 only once calls are
answered, WATCHDOG=1 periodically and held back while one job runs past
watchdog.stuck_job_s, STATUS= lines, STOPPING=1 on SIGTERM); SIGTERM with
save_on_stop and with a grace that runs out; the unit, sysusers.d and
tmpfiles.d files checked by systemd's own tools and placed by meson install.

Each test starts its own daemon. Run from the source root (meson runs it
through run_py.sh): ENGINED_BIN=build/daemon/engined MESON_BUILD_ROOT=build
PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_systemd.py [-k name]
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from daemon_fixture import Daemon, wait_for, make_tmp

from engined_client import EngineClient

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Notify:
    """A NOTIFY_SOCKET: every datagram with its arrival time. on_ready runs
    in the receiving thread as soon as READY=1 arrives."""

    def __init__(self, on_ready=None):
        self.dir = make_tmp(prefix="engined-notify-")
        self.path = os.path.join(self.dir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.05)
        self.msgs = []          # (time, {key: value})
        self.on_ready = on_ready
        self.ready_result = None
        self.stop = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            kv = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
            t = time.time()
            # Call Health the moment READY=1 arrives, and only then publish
            # the message, so that a waiter on READY also sees the result.
            if kv.get("READY") == "1" and self.on_ready and self.ready_result is None:
                try:
                    self.ready_result = self.on_ready()
                except Exception as e:  # noqa: BLE001
                    self.ready_result = e
            self.msgs.append((t, kv))

    def env(self, watchdog_usec=None):
        e = {"NOTIFY_SOCKET": self.path}
        if watchdog_usec:
            e["WATCHDOG_USEC"] = str(watchdog_usec)
        return e

    def times(self, key, value=None):
        return [t for t, kv in self.msgs if key in kv and (value is None or kv[key] == value)]

    def values(self, key):
        return [kv[key] for _, kv in self.msgs if key in kv]

    def wait(self, key, value=None, timeout=10, pred=None):
        t0 = time.time()
        while time.time() - t0 < timeout:
            for _, kv in list(self.msgs):
                if key in kv and (value is None or kv[key] == value) and \
                        (pred is None or pred(kv[key])):
                    return kv[key]
            time.sleep(0.01)
        raise AssertionError("no %s=%s in %r" % (key, value, self.msgs[-10:]))

    def wait_count(self, key, value, count, after, timeout=10):
        """Wait for `count` messages key=value that arrived after `after`."""
        wait_for(lambda: len([t for t in self.times(key, value) if t > after]) >= count,
                 "%d %s=%s" % (count, key, value), timeout)

    def close(self):
        self.stop = True
        self.t.join()
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def ready_probe(port_file):
    """Called when READY=1 arrives: the port must answer at once."""
    port = int(open(port_file).read().split()[0])
    with EngineClient("127.0.0.1:%d" % port, timeout=2) as c:
        return c.health()


def test_status_shows_the_running_jobs_progress():
    """STATUS= names the running job and its progress (a save held after
    its model file: a third of its tensor bytes)."""
    n = Notify()
    d = Daemon(env=n.env(), safe_points=True)
    try:
        n.wait("READY", "1")
        with EngineClient(d.addr, timeout=60) as c:
            c.initialize(preset="tiny")
            d.hold_safe_points()
            t = threading.Thread(target=lambda: c.save_checkpoint("ck"))
            t.start()
            n.wait("STATUS", timeout=60, pred=lambda s: "running SaveCheckpoint (" in s and
                   ", model.safetensors 33%)" in s)
            d.release_safe_points()
            t.join(60)
        n.wait("STATUS", timeout=60, pred=lambda s: s.endswith("idle, 0 queued"))
    finally:
        d.stop()
        n.close()


def test_ready_watchdog_status_stopping():
    tmp = make_tmp(prefix="engined-sd-")
    n = Notify(on_ready=lambda: ready_probe(os.path.join(tmp, "port")))
    d = Daemon(env=n.env(watchdog_usec=200000), tmp=tmp)
    try:
        n.wait("READY", "1")
        assert n.ready_result == "SERVING", n.ready_result
        first = n.msgs[0][1]
        assert first.get("READY") == "1", "READY=1 must come first: %r" % n.msgs[:3]
        assert first["STATUS"].startswith("serving on 127.0.0.1:%d; engine not initialized"
                                          % d.port), first
        assert int(first["MAINPID"]) == d.proc.pid
        t_ready = n.times("READY", "1")[0]
        time.sleep(0.6)
        pings = [t for t in n.times("WATCHDOG", "1") if t >= t_ready]
        # Every 100 ms (half of WATCHDOG_USEC): about 6 in 0.6 s.
        assert 4 <= len(pings) <= 9, len(pings)
        gaps = np.diff(pings)
        assert gaps.max() < 0.25, gaps
        with EngineClient(d.addr, timeout=30) as c:
            c.initialize(replace=True, preset="tiny")
            c.set_mode("train")
        n.wait("STATUS", pred=lambda s: "language_model/native/cpu step 0, mode TRAIN, idle"
               in s)
        d.signal(signal.SIGTERM)
        assert d.wait(30) == 0
        n.wait("STOPPING", "1")
    finally:
        d.stop()
        n.close()
    assert "watchdog: pinging systemd every 100 ms" in d.log_text()


def test_watchdog_held_back_while_a_job_is_stuck():
    """A job held (test hook) past watchdog.stuck_job_s: the daemon reports
    STATUS=engine stuck and sends no WATCHDOG=1 from then until the job
    ends; then the pings resume."""
    n = Notify()
    d = Daemon("-o", "watchdog.stuck_job_s=0.1", env=n.env(watchdog_usec=100000), hold=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        c.initialize(replace=True, preset="tiny")
        ids, lens = np.arange(64, dtype=np.int32), [32, 32]
        d.hold()
        # The held job's "stuck", not an earlier one's: Initialize itself can
        # pass 0.1 s (a sanitizer build, a loaded machine) and be reported.
        t_hold = time.time()
        t = threading.Thread(target=c.forward_backward, args=(ids, lens),
                             kwargs={"loss": "sft"})
        t.start()

        def stuck_after_hold():
            return [t for t, kv in n.msgs if t > t_hold and
                    kv.get("STATUS", "").startswith("engine stuck: one job has run")]
        wait_for(stuck_after_hold, "STATUS=engine stuck after the hold", 60)
        t_stuck = stuck_after_hold()[0]
        time.sleep(0.3)  # ~6 ping periods in which none may come
        t_release = time.time()
        d.release()
        t.join()
        n.wait_count("WATCHDOG", "1", 3, after=t_release, timeout=60)
        during = [p for p in n.times("WATCHDOG", "1") if t_stuck < p < t_release]
        assert not during, "pinged while the job was past stuck_job_s: %r" % during
        c.close()
    finally:
        assert d.stop() == 0
        n.close()
    log = d.log_text()
    assert "no longer pinging systemd" in log and "the long job ended; pinging again" in log


def test_sigterm_save_on_stop():
    d = Daemon("-o", "shutdown.save_on_stop=final/on-stop")
    try:
        c = EngineClient(d.addr, timeout=60)
        c.initialize(replace=True, preset="tiny", seed=4)
        ids, lens = np.arange(64, dtype=np.int32), [32, 32]
        c.forward_backward(ids, lens, loss="sft")
        assert c.optimizer_step().step == 1
        w = dict(c.stream_weights())
        c.close()
        d.signal(signal.SIGTERM)
        assert d.wait(60) == 0
    finally:
        d.stop()
    ck = os.path.join(d.ckpt_root, "final/on-stop")
    state = json.load(open(os.path.join(ck, "engine_state.json")))
    assert state["global_step"] == 1, state
    assert os.path.exists(os.path.join(ck, "optimizer.safetensors"))
    # The weights saved are the ones the clients last saw.
    with open(os.path.join(ck, "model.safetensors"), "rb") as f:
        hlen = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(hlen))
        data = f.read()
    b, e = header["model.norm.weight"]["data_offsets"]
    assert np.array_equal(np.frombuffer(data[b:e], "<f4"), w["model.norm.weight"])
    log = d.log_text()
    assert "save_on_stop: saved step 1 to 'final/on-stop'" in log, log


def test_sigterm_grace_runs_out():
    """SIGTERM while a job is held past shutdown.grace_s: the daemon exits 1
    without waiting for it, and the job's client gets an error."""
    d = Daemon("-o", "shutdown.grace_s=0.05", hold=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        c.initialize(replace=True, preset="tiny")
        ids, lens = np.arange(64, dtype=np.int32), [32, 32]
        err = {}

        def job():
            try:
                c.forward_backward(ids, lens, loss="sft")
            except Exception as e:  # noqa: BLE001
                err["e"] = e
        d.hold()
        t = threading.Thread(target=job)
        t.start()
        c2 = EngineClient(d.addr, timeout=10)
        wait_for(lambda: c2.get_status().busy, "the job to start")
        d.signal(signal.SIGTERM)
        rc = d.wait(60)
        t.join()
        assert rc == 1, rc
        assert "e" in err, "the job cannot have finished"
        c.close()
        c2.close()
    finally:
        d.stop()
    assert "did not finish within shutdown.grace_s = 0.1 s" in d.log_text() or \
        "did not finish within shutdown.grace_s = 0.0 s" in d.log_text(), d.log_text()


def test_unit_files():
    build = os.environ["MESON_BUILD_ROOT"]
    unit = os.path.join(build, "daemon", "engined@.service")
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed (package systemd)")
    tmp = make_tmp(prefix="engined-unit-")
    text = open(unit).read()
    for key in ["Type=notify", "WatchdogSec=", "Restart=on-failure",
                "Environment=CUDA_VISIBLE_DEVICES=%i", "ProtectSystem=strict",
                "ReadWritePaths=/var/lib/engined", "PrivateTmp=yes", "NoNewPrivileges=yes",
                "ProtectHome=yes", "DeviceAllow=char-nvidia-frontend rw",
                "RuntimeDirectory=engined/%i", "RuntimeDirectoryMode=0750",
                "ExecStart=%s --config /etc/engined/%%i.conf" % ENGINED_INSTALLED(build)]:
        assert key in text, key
    # verify checks that ExecStart exists: point it at the built binary.
    with open(os.path.join(tmp, "engined@.service"), "w") as f:
        f.write(text.replace(ENGINED_INSTALLED(build), os.environ["ENGINED_BIN"]))
    p = subprocess.run(["systemd-analyze", "verify", "--man=no",
                        os.path.join(tmp, "engined@0.service")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr.strip() == "", (p.returncode, p.stderr)
    # systemd-analyze reports unknown keys on stderr: make sure it would.
    with open(os.path.join(tmp, "broken@.service"), "w") as f:
        f.write(text.replace("ProtectSystem=", "ProtectSystm=").replace(
            ENGINED_INSTALLED(build), os.environ["ENGINED_BIN"]))
    p = subprocess.run(["systemd-analyze", "verify", "--man=no",
                        os.path.join(tmp, "broken@0.service")],
                       capture_output=True, text=True, timeout=60)
    assert "Unknown key 'ProtectSystm'" in p.stderr, p.stderr
    # sysusers.d and tmpfiles.d, applied to an empty root.
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "etc"))
    p = subprocess.run(["systemd-sysusers", "--root=" + root,
                        os.path.join(SRC, "deploy/engined.sysusers.conf")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert any(line.startswith("engined:") and line.endswith(":/var/lib/engined:/usr/sbin/nologin")
               for line in open(os.path.join(root, "etc/passwd")).read().split("\n"))
    p = subprocess.run(["systemd-tmpfiles", "--root=" + root, "--create",
                        os.path.join(SRC, "deploy/engined.tmpfiles.conf")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert os.path.isdir(os.path.join(root, "etc/engined"))
    # The example configuration is valid.
    p = subprocess.run([os.environ["ENGINED_BIN"], "--check-config",
                        os.path.join(SRC, "deploy/engined.conf.example")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    # meson install places the files where systemd reads them.
    p = subprocess.run(["meson", "introspect", "--installed", build],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    dest = set(json.loads(p.stdout).values())
    prefix = ENGINED_INSTALLED(build)[:-len("/bin/engined")]
    for want in ["lib/systemd/system/engined@.service", "lib/sysusers.d/engined.conf",
                 "lib/tmpfiles.d/engined.conf", "bin/engined"]:
        assert os.path.join(prefix, want) in dest, (want, sorted(dest))
    shutil.rmtree(tmp, ignore_errors=True)


def ENGINED_INSTALLED(build):  # noqa: N802 - a constant of the build
    p = subprocess.run(["meson", "introspect", "--buildoptions", build],
                       capture_output=True, text=True, timeout=60)
    opts = {o["name"]: o["value"] for o in json.loads(p.stdout)}
    return os.path.join(opts["prefix"], opts["bindir"], "engined")
