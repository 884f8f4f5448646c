"""test_enginectl_files.py — enginectl's file formats against independent readers.

pull-weights writes its .safetensors file with engines/io's writer (the
bytes as streamed, no conversion); the PyPI `safetensors` package must read
back exactly what the Python client streams, in each dtype. init --config
reads the file with io_read_file: its errors keep enginectl's message, and
an endless file is refused instead of exhausting memory.

Runs with build/venv-pypi's python (PyPI safetensors; Debian's torch for
BF16, which numpy cannot represent: safetensors' framework="pt", compared
as raw bits). Run: ENGINED_BIN=... ENGINECTL_BIN=... build/venv-pypi/bin/python
-m pytest tests/integration/test_enginectl_files.py
"""
import json
import os
import subprocess

import numpy as np

from daemon_fixture import Daemon

from engined_client import EngineClient


def ctl(d, *args):
    return subprocess.run([os.environ["ENGINECTL_BIN"], "--addr", d.addr, "--timeout", "60"]
                          + list(args), capture_output=True, text=True, timeout=120)


def read_st(path):
    """{name: (dtype name, ndarray)}; BF16 as uint16 bits."""
    import torch
    from safetensors import safe_open
    out = {}
    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            dt = f.get_slice(k).get_dtype()
            a = t.view(torch.int16).numpy().view(np.uint16) if dt == "BF16" else t.numpy()
            out[k] = (dt, a.copy())
    return out


def test_pull_weights_read_by_safetensors():
    d = Daemon()
    try:
        p = ctl(d, "init", "--preset", "tiny", "--seed", "5")
        assert p.returncode == 0, p.stderr
        c = EngineClient(d.addr)
        for dtype, name, st_name in (("f32", "float32", "F32"), ("bf16", "bfloat16", "BF16"),
                                     ("f16", "float16", "F16")):
            out = os.path.join(d.tmp, "w_%s.safetensors" % dtype)
            p = ctl(d, "pull-weights", "--out", out, "--dtype", dtype)
            assert p.returncode == 0 and "wrote " + out in p.stdout, p.stderr
            got = read_st(out)
            want = {k: v.copy() for k, v in c.stream_weights(name)}
            assert len(want) > 10 and set(got) == set(want), (sorted(got), sorted(want))
            for k, a in want.items():
                dt, b = got[k]
                assert dt == st_name and b.shape == a.shape, (k, dt, b.shape, a.shape)
                assert b.tobytes() == a.tobytes(), k
            # The reference writer's layout: one dtype, so tensors by name.
            with open(out, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            names = [k for k in header if k != "__metadata__"]
            assert names == sorted(names) and n % 8 == 0
        c.close()
        # A path that cannot be created: the writer's message, exit 1, no file.
        bad = os.path.join(d.tmp, "no-such-dir", "w.safetensors")
        p = ctl(d, "pull-weights", "--out", bad)
        assert p.returncode == 1 and "no-such-dir/w.safetensors: cannot create" in p.stderr, \
            p.stderr
    finally:
        assert d.stop() == 0


def test_init_config_file_errors():
    d = Daemon()
    try:
        missing = os.path.join(d.tmp, "missing.json")
        p = ctl(d, "init", "--config", missing)
        assert p.returncode == 1 and \
            "enginectl: cannot read %s: No such file or directory" % missing in p.stderr, p.stderr
        p = ctl(d, "init", "--config", "/dev/zero")
        assert p.returncode == 1 and \
            "enginectl: cannot read /dev/zero: File too large" in p.stderr, p.stderr
        cfg = os.path.join(d.tmp, "config.json")
        with open(cfg, "w") as f:
            json.dump(dict(model_type="llama", architectures=["LlamaForCausalLM"],
                           vocab_size=128, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, max_position_embeddings=64,
                           rms_norm_eps=1e-5, tie_word_embeddings=False), f)
        p = ctl(d, "init", "--config", cfg)
        assert p.returncode == 0 and "initialized" in p.stdout, p.stderr
    finally:
        assert d.stop() == 0
