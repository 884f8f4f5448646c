"""test_tinker_unit.py — deploy/engined-tinker.service: systemd-analyze
verifies it (its ExecStart pointed at this venv's engined-tinker), and the
command line it runs, with deploy/tinker.env.example's values, is one the
gateway accepts."""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest

from engined_client.tinker import cli

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
UNIT = os.path.join(SRC, "deploy", "engined-tinker.service")
ENV = os.path.join(SRC, "deploy", "tinker.env.example")
INSTALLED = "/opt/engined-tinker/bin/engined-tinker"


def env_file():
    out = {}
    for line in open(ENV):
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    return out


def exec_start():
    line = next(ln for ln in open(UNIT) if ln.startswith("ExecStart="))
    return line[len("ExecStart="):].strip()


def test_command_line_parses():
    env = env_file()
    argv = []
    # systemd: ${X} is one argument, $X splits at whitespace.
    for word in exec_start().split():
        if word.startswith("${"):
            argv.append(env[word[2:-1]])
        elif word.startswith("$"):
            argv += shlex.split(env[word[1:]])
        else:
            argv.append(word)
    assert argv[0] == INSTALLED
    args = cli.parser().parse_args(argv[1:])
    assert args.listen == ("0.0.0.0", 8000) and len(args.engined) == 4
    assert args.api_keys == "/etc/engined/tinker-keys"


def test_systemd_analyze_verify():
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed (package systemd)")
    exe = os.path.join(os.path.dirname(sys.executable), "engined-tinker")
    tmp = tempfile.mkdtemp(prefix="engined-tinker-unit-")
    try:
        for name, text in (("engined-tinker.service", open(UNIT).read()),
                           ("broken-tinker.service",
                            open(UNIT).read().replace("ProtectSystem=", "ProtectSystm="))):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(text.replace(INSTALLED, exe))
            p = subprocess.run(["systemd-analyze", "verify", "--man=no", path],
                               capture_output=True, text=True, timeout=60)
            if name.startswith("broken"):
                assert "Unknown key 'ProtectSystm'" in p.stderr, p.stderr
            else:
                assert p.returncode == 0 and p.stderr.strip() == "", (p.returncode, p.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
