"""gateway_fixture.py — an engined daemon with a tiny random Llama saved by
transformers, and engined-tinker over it, for the tests that drive the
gateway with the real tinker SDK (tests/tinker)."""
import contextlib
import os
import socket
import subprocess
import sys
import time

from daemon_fixture import Daemon

KEY = "tml-engined-test-key"
MODEL = "tiny-llama"


def save_tiny_llama(model_dir, seed=0, hidden=64, layers=2, max_positions=256):
    import torch
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=hidden,
                                   intermediate_size=2 * hidden, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=max_positions,
                                   eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).save_pretrained(model_dir)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """engined-tinker over `daemons` (each its own engine), as a subprocess."""

    def __init__(self, daemons, model_dir, extra=(), engined=True):
        """engined: one --engined per daemon (False: extra names them)."""
        self.tmp = daemons[0].tmp
        self.keys = os.path.join(self.tmp, "tinker-keys")
        with open(self.keys, "w") as f:
            f.write("# test keys\n%s\n" % KEY)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = os.path.join(self.tmp, "gateway-%d.log" % self.port)
        exe = os.path.join(os.path.dirname(sys.executable), "engined-tinker")
        self.args = [exe, "--listen", "127.0.0.1:%d" % self.port, "--api-keys", self.keys,
                     "--model", MODEL, "--model-dir", model_dir,
                     "--checkpoint-root", daemons[0].ckpt_root, "--log-level", "warning"]
        for d in daemons if engined else ():
            self.args += ["--engined", d.addr]
        self.args += list(extra)
        self._start()

    def restart(self):
        """Stop the gateway and start a new one on the same port."""
        self.stop()
        self._start()

    def _start(self):
        self.proc = subprocess.Popen(self.args, stdout=open(self.log_path, "ab"),
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("engined-tinker exited:\n" + self.log())
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("engined-tinker did not start:\n" + self.log())

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(n_daemons=1, extra=(), **model):
    """(daemons, model_dir, gateway): the model (save_tiny_llama's
    arguments) saved under the first daemon's model root (every daemon
    shares that root and its checkpoint root)."""
    first = Daemon()
    daemons = [first]
    model_dir = os.path.join(first.model_root, MODEL)
    save_tiny_llama(model_dir, **model)
    for _ in range(n_daemons - 1):
        daemons.append(Daemon("--model-root", first.model_root, "--checkpoint-root",
                              first.ckpt_root))
    return daemons, model_dir, Gateway(daemons, model_dir, extra)


@contextlib.contextmanager
def running(n_daemons=1, extra=(), **model):
    """start()'s daemons, model directory and gateway, stopped at the end."""
    daemons, model_dir, gw = start(n_daemons, extra, **model)
    try:
        yield daemons, model_dir, gw
    finally:
        gw.stop()
        for d in daemons:
            d.stop()
