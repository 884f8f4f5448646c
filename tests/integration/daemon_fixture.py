"""Start and stop a real engined for the integration tests.

The daemon binary comes from $ENGINED_BIN (meson sets it); it listens on a
free loopback port chosen by the kernel (--listen 127.0.0.1:0 with
--port-file) with checkpoint and model roots in a fresh temporary directory,
removed when the test process exits (ENGINED_KEEP_TEST_TMP=1 keeps it).
Daemon(hold=True) sets the test-only hook ENGINED_TEST_HOLD_FILE: between
hold() and release() every job that comes up waits before it runs, so a
test holds a job as long as it needs instead of sizing it to the machine.
conftest.py builds the pytest fixtures (a module's shared daemon) on it;
tests that need special flags start their own Daemon.
"""
import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time


def make_tmp(prefix="engined-it-", dir=None):
    """tempfile.mkdtemp, removed when the test process exits (the one way
    the tests make temporary directories, so that runs leave none)."""
    path = tempfile.mkdtemp(prefix=prefix, dir=dir)
    _remove_at_exit(path)
    return path


def _remove_at_exit(path):
    """Remove a directory this process made when it exits (tests read the
    daemon's log and files after stop(), so not at stop);
    ENGINED_KEEP_TEST_TMP=1 keeps them for a post-mortem."""
    if os.environ.get("ENGINED_KEEP_TEST_TMP") != "1":
        atexit.register(shutil.rmtree, path, True)


class Daemon:
    """listen: the --listen address (None: none on the command line, e.g.
    when a config file gives them). env: extra environment variables.
    tmp: directory to use (default: a new one). hold: enable hold()/release().
    wrap: a command that runs the daemon's command line (appended to it),
    e.g. to start it in its own mount namespace; it must exec the daemon,
    so that proc.pid is the daemon's."""

    def __init__(self, *extra_args, bin_path=None, listen="127.0.0.1:0", env=None,
                 tmp=None, hold=False, wrap=None, safe_points=False):
        self.bin = bin_path or os.environ.get("ENGINED_BIN", "build/daemon/engined")
        self.tmp = tmp or make_tmp()
        self.ckpt_root = os.path.join(self.tmp, "checkpoints")
        self.model_root = os.path.join(self.tmp, "models")
        self.port_file = os.path.join(self.tmp, "port")
        self.log_path = os.path.join(self.tmp, "engined.log")
        self.log = open(self.log_path, "wb")
        args = [self.bin] + (["--listen", listen] if listen else []) + [
                "--port-file", self.port_file,
                "--checkpoint-root", self.ckpt_root, "--model-root", self.model_root,
                "--threads", "2"] + list(extra_args)
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.hold_file = os.path.join(self.tmp, "hold") if hold else None
        if self.hold_file:
            full_env["ENGINED_TEST_HOLD_FILE"] = self.hold_file
        # safe_points: hold_safe_points() makes running jobs wait at their
        # safe points (between a ForwardBackward's micro-batches).
        self.safe_point_file = os.path.join(self.tmp, "safe") if safe_points else None
        if self.safe_point_file:
            full_env["ENGINED_TEST_SAFE_POINT_FILE"] = self.safe_point_file
        self.proc = subprocess.Popen(list(wrap or []) + args, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=full_env)
        deadline = time.time() + 20
        while time.time() < deadline:
            if os.path.exists(self.port_file) and open(self.port_file).read().strip():
                break
            if self.proc.poll() is not None:
                raise RuntimeError("engined exited at start:\n" + self.log_text())
            time.sleep(0.02)
        else:
            self.stop()
            raise RuntimeError("engined did not start:\n" + self.log_text())
        self.ports = [int(x) for x in open(self.port_file).read().split()]
        self.port = self.ports[0]
        self.addr = "127.0.0.1:%d" % self.port

    def hold(self):
        """Jobs that come up from now on wait before they run."""
        open(self.hold_file, "w").close()

    def release(self):
        """A held job runs; later jobs run at once."""
        os.unlink(self.hold_file)

    def hold_safe_points(self, after=0):
        """Running jobs wait at their safe points; the first `after` safe
        points reached from now on are let by (the file holds the count,
        written whole: daemon/test_hold.h)."""
        tmp = self.safe_point_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % after if after else "")
        os.replace(tmp, self.safe_point_file)

    def release_safe_points(self):
        os.unlink(self.safe_point_file)

    def safe_points_held(self):
        """How many times a job has waited at a safe point so far (the
        hook logs one line for each hold: daemon/test_hold.c)."""
        return self.log_text().count("safe point held")

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait(self, timeout=30):
        return self.proc.wait(timeout=timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def wait_for(cond, what, timeout=60):
    """Poll cond() until it is true; fail naming `what` after timeout s (a
    bound for a hung daemon, far above any machine's speed)."""
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.002)
