"""enginectl's command line: --version, help (the command list and each
command's usage and options), usage errors (a bad number names its option,
unknown options and stray arguments: exit 2 with a hint), and the
commands against a real engined (init, set-mode, save, load, status,
pull-weights, create-adapter, delete-adapter); sample against a server of
Sample alone (sample_server.py): the request it sends and its output.

Run: ENGINED_BIN=... ENGINECTL_BIN=... ENGINED_PROJECT_VERSION=0.1.0
/usr/bin/python3 -m pytest tests/integration/test_enginectl.py [-k name]
"""
import json
import os
import re
import struct
import subprocess

import grpc

from daemon_fixture import Daemon, make_tmp
from engined_client import pb
from sample_server import HANG, SampleServer

CTL = os.environ.get("ENGINECTL_BIN", "build/client/enginectl")

# Every command and the options it has today (README.md and the tests use them).
COMMANDS = {
    "status": ["--adapter NAME"],
    "init": ["--preset NAME", "--config FILE", "--model-path DIR", "--model-type TYPE",
             "--device DEV", "--seed N", "--lr X", "--bf16-matmul", "--replace",
             "--frozen-base"],
    "set-mode": ["--no-auto-offload", "--adapter NAME"],
    "to-device": ["--model", "--optimizer", "--grad", "--adapter NAME"],
    "save": ["--step N", "--keep K"],
    "load": [],
    "pull-weights": ["--out FILE", "--dtype TYPE", "--names A,B,...", "--bucket-bytes N",
                     "--adapter NAME", "--view VIEW"],
    "create-adapter": ["--rank N", "--alpha X", "--targets A,B,...", "--seed N",
                       "--peft-dir DIR", "--rslora", "--lr X"],
    "delete-adapter": [],
    "sample": ["--prompt A,B,...", "--max-tokens N", "--num-samples K", "--temperature T",
               "--top-k K", "--top-p P", "--seed N", "--stop-token ID",
               "--stop-sequence A,B,...", "--top-logprobs K", "--prompt-logprobs",
               "--adapter NAME"],
    "demo": ["--preset NAME", "--sft-steps N", "--ppo-steps N", "--checkpoint-root DIR"],
    "help": [],
}
GLOBAL = ["--addr ADDR", "--timeout SEC", "--retries N", "--tls-ca PEM", "--tls-cert PEM", "--tls-key PEM",
          "--tls-server-name NAME", "--token-file FILE", "--no-progress", "--version",
          "-h, --help"]


def ctl(*args, env=None):
    return subprocess.run([CTL] + list(args), capture_output=True, text=True, timeout=120,
                          env=env)


def option_lines(text):
    """The options a help text lists: '--name ARG' of each '  --name ARG  help' line."""
    return [re.split(r"\s{2,}", line.strip())[0] for line in text.splitlines()
            if line.startswith("  -")]


def test_version():
    want = os.environ["ENGINED_PROJECT_VERSION"]
    p = ctl("--version")
    assert p.returncode == 0 and p.stderr == "", (p.returncode, p.stderr)
    assert p.stdout == "enginectl %s\n" % want, (p.stdout, want)


def test_help_lists_commands():
    p = ctl("help")
    assert p.returncode == 0 and p.stderr == "", (p.returncode, p.stderr)
    lines = p.stdout.splitlines()
    assert lines[0] == "usage: enginectl [global options] COMMAND [options]", lines[0]
    start, end = lines.index("commands:"), lines.index("global options:")
    listed = [line.split()[0] for line in lines[start + 1:end]]
    assert listed == list(COMMANDS), listed
    for line in lines[start + 1:end]:       # one line each, with a summary
        assert len(line.split(None, 1)) == 2, line
    assert option_lines("\n".join(lines[end:])) == GLOBAL, option_lines("\n".join(lines[end:]))
    for alias in (["--help"], ["-h"]):
        q = ctl(*alias)
        assert q.returncode == 0 and q.stdout == p.stdout, alias
    # No command: the same list, on stderr, exit 2.
    q = ctl()
    assert q.returncode == 2 and q.stdout == "" and q.stderr == p.stdout, q


def test_help_each_command():
    for name, opts in COMMANDS.items():
        p = ctl("help", name)
        assert p.returncode == 0 and p.stderr == "", (name, p.returncode, p.stderr)
        assert p.stdout.startswith("usage: enginectl [global options] %s" % name), p.stdout
        assert option_lines(p.stdout) == opts + ["-h, --help"], (name, option_lines(p.stdout))
        for flag in ("--help", "-h"):
            q = ctl(name, flag)
            assert q.returncode == 0 and q.stdout == p.stdout, (name, flag, q.stdout)
    p = ctl("help", "frobnicate")
    assert p.returncode == 2 and "unknown command 'frobnicate'" in p.stderr, p.stderr
    assert "Try 'enginectl help'" in p.stderr, p.stderr


def usage_error(args, message, cmd):
    """args exit 2 before any connection with message and the hint on stderr."""
    p = ctl("--addr", "127.0.0.1:1", *args)
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    assert p.stdout == "", (args, p.stdout)
    first, hint = p.stderr.splitlines()
    assert first == message, (args, first, message)
    want = "Try 'enginectl help %s' for its usage." % cmd if cmd else \
        "Try 'enginectl help' for the commands and global options."
    assert hint == want, (args, hint)


def test_bad_numbers():
    usage_error(["init", "--seed", "x"], "enginectl: init: --seed: 'x' is not an integer", "init")
    usage_error(["init", "--seed", "12abc"],
                "enginectl: init: --seed: '12abc' is not an integer", "init")
    usage_error(["init", "--seed", "-1"],
                "enginectl: init: --seed: '-1' is out of range (0 to 18446744073709551615)",
                "init")
    usage_error(["init", "--lr", "0.1x"], "enginectl: init: --lr: '0.1x' is not a number", "init")
    usage_error(["init", "--lr", "nan"],
                "enginectl: init: --lr: 'nan' is not a finite number", "init")
    usage_error(["save", "p", "--keep", "1e3"],
                "enginectl: save: --keep: '1e3' is not an integer", "save")
    usage_error(["save", "p", "--keep", "2147483648"],
                "enginectl: save: --keep: '2147483648' is out of range "
                "(-2147483648 to 2147483647)", "save")
    usage_error(["save", "p", "--step", "99999999999999999999"],
                "enginectl: save: --step: '99999999999999999999' is out of range "
                "(-9223372036854775808 to 9223372036854775807)", "save")
    usage_error(["pull-weights", "--out", "w", "--bucket-bytes", ""],
                "enginectl: pull-weights: --bucket-bytes: '' is not an integer", "pull-weights")
    usage_error(["demo", "--sft-steps", "-1"],
                "enginectl: demo: --sft-steps: '-1' is out of range (0 to 1000000)", "demo")
    usage_error(["demo", "--ppo-steps", "four"],
                "enginectl: demo: --ppo-steps: 'four' is not an integer", "demo")
    usage_error(["sample", "--prompt", "1,x", "--max-tokens", "2"],
                "enginectl: sample: --prompt: 'x' is not an integer", "sample")
    usage_error(["sample", "--prompt", "1,,2", "--max-tokens", "2"],
                "enginectl: sample: --prompt: '' is not an integer", "sample")
    usage_error(["sample", "--prompt", "1", "--max-tokens", "2147483648"],
                "enginectl: sample: --max-tokens: '2147483648' is out of range "
                "(-2147483648 to 2147483647)", "sample")
    usage_error(["sample", "--prompt", "1", "--max-tokens", "2", "--temperature", "hot"],
                "enginectl: sample: --temperature: 'hot' is not a number", "sample")
    usage_error(["--timeout", "soon", "status"],
                "enginectl: --timeout: 'soon' is not a number", None)


def test_bad_usage():
    usage_error(["init", "--frobnicate"], "enginectl: init: unknown option '--frobnicate'", "init")
    usage_error(["init", "--model", "x"],
                "enginectl: init: ambiguous option '--model' (--model-path, --model-type)",
                "init")
    usage_error(["init", "--seed"], "enginectl: init: --seed needs an argument (N)", "init")
    usage_error(["init", "--bf16-matmul=yes"],
                "enginectl: init: --bf16-matmul takes no argument", "init")
    usage_error(["status", "now"], "enginectl: status: unexpected argument 'now'", "status")
    usage_error(["load", "-x", "p"], "enginectl: load: unknown option '-x'", "load")
    usage_error(["load"], "enginectl: load: missing PATH", "load")
    usage_error(["save", "a", "b"], "enginectl: save: unexpected argument 'b'", "save")
    usage_error(["set-mode", "fast"],
                "enginectl: set-mode: 'fast' is not a mode (idle, train or eval)", "set-mode")
    usage_error(["to-device", "cpu", "--weights"],
                "enginectl: to-device: unknown option '--weights'", "to-device")
    usage_error(["pull-weights", "--dtype", "bf16"],
                "enginectl: pull-weights: --out FILE is required", "pull-weights")
    usage_error(["pull-weights", "--out", "w", "--dtype", "f64"],
                "enginectl: pull-weights: --dtype: 'f64' is not f32, bf16 or f16",
                "pull-weights")
    usage_error(["sample", "--max-tokens", "4"],
                "enginectl: sample: --prompt A,B,... is required", "sample")
    usage_error(["sample", "--prompt", "1,2"],
                "enginectl: sample: --max-tokens N is required", "sample")
    usage_error(["--frobnicate", "status"], "enginectl: unknown option '--frobnicate'", None)
    usage_error(["frobnicate"], "enginectl: unknown command 'frobnicate'", None)


def safetensors_names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return sorted(k for k in header if k != "__metadata__")


def test_commands_against_daemon():
    d = Daemon()
    out = os.path.join(make_tmp(prefix="enginectl-it-"), "w.safetensors")
    base = ["--addr", d.addr, "--timeout", "60"]
    try:
        p = ctl(*base, "status")
        assert p.returncode == 0 and "engine      not initialized" in p.stdout, p
        p = ctl(*base, "init", "--preset", "tiny", "--seed", "7", "--lr", "1e-4")
        assert p.returncode == 0, p.stderr
        m = re.fullmatch(r"initialized language_model/native/cpu: (\d+) parameters "
                         r"in (\d+) tensors\n", p.stdout)
        assert m, p.stdout
        nparams, ntensors = int(m.group(1)), int(m.group(2))
        p = ctl(*base, "set-mode", "train")
        assert p.returncode == 0 and p.stdout.startswith("mode train\n"), p
        p = ctl(*base, "save", "run/s1", "--step", "5", "--keep", "2")
        assert p.returncode == 0 and p.stdout.startswith("saved run/s1 ("), p
        assert os.path.isfile(os.path.join(d.ckpt_root, "run/s1/model.safetensors"))
        p = ctl(*base, "load", "run/s1")
        assert p.returncode == 0 and p.stdout == "loaded run/s1 at global step 5\n", p
        p = ctl(*base, "status")
        assert p.returncode == 0, p.stderr
        assert "engine      language_model/native/cpu, %d parameters\n" % nparams in p.stdout
        assert "lr 0.0001\n" in p.stdout, p.stdout
        p = ctl(*base, "pull-weights", "--out", out, "--dtype", "bf16")
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith("received %d tensors, " % ntensors), p.stdout
        assert p.stdout.endswith("wrote %s\n" % out), p.stdout
        assert len(safetensors_names(out)) == ntensors
        # The daemon's own error: exit 1, CODE: message.
        p = ctl(*base, "load", "missing")
        assert p.returncode == 1 and "enginectl: LoadCheckpoint: NOT_FOUND: " in p.stderr, p
    finally:
        assert d.stop() == 0


def test_adapter_commands():
    d = Daemon()
    out = os.path.join(make_tmp(prefix="enginectl-it-"), "a.safetensors")
    base = ["--addr", d.addr, "--timeout", "60"]
    try:
        p = ctl(*base, "init", "--frozen-base")
        assert p.returncode == 0, p.stderr
        p = ctl(*base, "create-adapter", "t1", "--rank", "4", "--alpha", "16",
                "--targets", "q_proj,down_proj", "--lr", "1e-3")
        assert p.returncode == 0, p.stderr
        # tiny: 4 layers x 4 x ((128 + 128) + (384 + 128)) parameters.
        assert p.stdout == ("created adapter t1: rank 4, alpha 16, targets q_proj,down_proj; "
                            "12288 parameters in 16 tensors\n"), p.stdout
        p = ctl(*base, "create-adapter", "t2")
        assert p.returncode == 0 and "rank 8, alpha 8, targets q_proj,v_proj;" in p.stdout, p
        p = ctl(*base, "create-adapter", "t2")
        assert p.returncode == 1 and "CreateAdapter: ALREADY_EXISTS: name:" in p.stderr, p
        p = ctl(*base, "status")
        assert p.returncode == 0 and "adapters    t1, t2\n" in p.stdout, p.stdout
        p = ctl(*base, "status", "--adapter", "t1")
        assert p.returncode == 0, p.stderr
        assert "adapter     t1 of language_model/native/cpu, 12288 parameters\n" in p.stdout
        assert "lr 0.001\n" in p.stdout, p.stdout
        p = ctl(*base, "set-mode", "train", "--adapter", "t1")
        assert p.returncode == 0 and p.stdout.startswith("mode train\n"), p
        p = ctl(*base, "to-device", "cpu", "--adapter", "t1")
        assert p.returncode == 0, p.stderr
        p = ctl(*base, "pull-weights", "--out", out, "--adapter", "t1")
        assert p.returncode == 0 and p.stdout.startswith("received 16 tensors, "), p
        names = safetensors_names(out)
        assert "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight" in names, names
        p = ctl(*base, "status", "--adapter", "zz")
        assert p.returncode == 1 and "NOT_FOUND: adapter: no adapter named 'zz'" in p.stderr
        p = ctl(*base, "delete-adapter", "t1")
        assert p.returncode == 0 and p.stdout == "deleted adapter t1\n", p
        p = ctl(*base, "delete-adapter", "t1")
        assert p.returncode == 1 and "DeleteAdapter: NOT_FOUND: name:" in p.stderr, p
    finally:
        assert d.stop() == 0


def completion(p, k, toks, reason=pb.FINISH_REASON_LENGTH, **kw):
    return pb.Completion(prompt_index=p, sample_index=k, token_ids=toks,
                         logprobs=[-0.5 - i for i in range(len(toks))], finish_reason=reason,
                         **kw)


def test_sample_output():
    """What `sample` sends and prints, against a server of Sample alone."""
    top = dict(top_token_ids=[7, 3, 9, 1], top_logprobs=[-0.5, -2.25, -1.5, -3.0])
    script = [
        [pb.SampleResponse(completions=[completion(1, 0, [7, 9], **top,
                                                   prompt_logprobs=[0, -1.25])],
                           weights_version=3),
         pb.SampleResponse(completions=[completion(0, 1, [4, 9], pb.FINISH_REASON_STOP, **top),
                                        completion(0, 0, [5, 6], **top)], weights_version=3)],
        [pb.SampleResponse(completions=[completion(0, 0, [8])]),
         (grpc.StatusCode.RESOURCE_EXHAUSTED, "kv cache: too small")],
        [pb.SampleResponse(completions=[completion(0, 0, [8, 8], top_token_ids=[1, 2, 3])])],
        [pb.SampleResponse(completions=[completion(0, 0, [8])])],
    ]
    with SampleServer(script) as srv:
        p = ctl("--addr", srv.addr, "--timeout", "60", "sample", "--prompt", "1,2,3",
                "--prompt", "4,5", "--max-tokens", "2", "--num-samples", "2",
                "--temperature", "0.5", "--top-k", "5", "--top-p", "0.75", "--seed", "7",
                "--stop-token", "9", "--stop-token", "10", "--stop-sequence", "3,4",
                "--stop-sequence", "6", "--top-logprobs", "2", "--prompt-logprobs",
                "--adapter", "a1")
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert lines[:3] == [
            "prompt 1 sample 0 length: 7 9 logprobs -0.5 -1.5 top 7:-0.5,3:-2.25 9:-1.5,1:-3 "
            "prompt-logprobs 0 -1.25",
            "prompt 0 sample 1 stop: 4 9 logprobs -0.5 -1.5 top 7:-0.5,3:-2.25 9:-1.5,1:-3",
            "prompt 0 sample 0 length: 5 6 logprobs -0.5 -1.5 top 7:-0.5,3:-2.25 9:-1.5,1:-3",
        ], lines
        assert re.fullmatch(r"done 3 completions, weights_version 3, \d+\.\d\d s", lines[3])
        assert len(lines) == 4
        req = srv.requests[0]
        assert list(req.seq_lens) == [3, 2] and req.input_ids.dtype == pb.INT32
        assert list(req.input_ids.shape) == [5]
        assert struct.unpack("<5i", req.input_ids.data) == (1, 2, 3, 4, 5)
        assert (req.max_tokens, req.num_samples, req.top_k, req.seed, req.top_logprobs,
                req.prompt_logprobs, req.adapter) == (2, 2, 5, 7, 2, True, "a1")
        assert req.HasField("temperature") and req.temperature == 0.5
        assert req.HasField("top_p") and req.top_p == 0.75
        assert list(req.stop_token_ids) == [9, 10]
        assert [list(s.token_ids) for s in req.stop_sequences] == [[3, 4], [6]]
        # The stream's error after a completion: its line, then CODE: message, exit 1.
        p = ctl("--addr", srv.addr, "sample", "--prompt", "1", "--max-tokens", "1")
        assert p.returncode == 1, p
        assert p.stdout == "prompt 0 sample 0 length: 8 logprobs -0.5\n", p.stdout
        assert p.stderr == "enginectl: Sample: RESOURCE_EXHAUSTED: kv cache: too small\n"
        req = srv.requests[1]
        assert not req.HasField("temperature") and not req.HasField("top_p")
        assert (req.num_samples, req.top_k, req.seed, list(req.stop_token_ids)) == (0, 0, 0, [])
        # A reply whose top_* are not k per token is refused.
        p = ctl("--addr", srv.addr, "sample", "--prompt", "1", "--max-tokens", "2")
        assert p.returncode == 1 and "Sample: DATA_LOSS: completion 0:" in p.stderr, p
        # --timeout covers the whole stream.
        srv.script[0].append(HANG)
        p = ctl("--addr", srv.addr, "--timeout", "0.5", "sample", "--prompt", "1",
                "--max-tokens", "1")
        assert p.returncode == 1 and "Sample: DEADLINE_EXCEEDED" in p.stderr, p
        assert p.stdout == "prompt 0 sample 0 length: 8 logprobs -0.5\n", p.stdout
