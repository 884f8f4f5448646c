"""The contract a controller can fully express (issue 12, first part):
explicit presence (lr = 0 and weight_decay = 0 are values, not "default"),
per-step optimizer hyper-parameters, ZeroGrad, temperature presence, and
wire compatibility with a client generated from the first proto.

Run: ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_contract.py [-k name]
"""
import os
import shutil
import subprocess
import sys

import grpc
import numpy as np
import pytest

from engined_client import pb
from rpc_expect import expect_details as expect

SC = grpc.StatusCode
HERE = os.path.dirname(os.path.abspath(__file__))


def batch():
    ids = (np.arange(64, dtype=np.int32) * 7) % 1024
    return ids, [32, 32]


def weights(client):
    return {k: v.copy() for k, v in client.stream_weights()}



def test_lr_zero_is_a_value(client):
    """lr = 0 (set explicitly): a step with real gradients changes nothing,
    since AdamW's update and the decoupled decay both scale with lr."""
    client.initialize(replace=True, preset="tiny", seed=1, optimizer={"lr": 0.0, "weight_decay": 0.1})
    w0 = weights(client)
    client.forward_backward(*batch(), loss="sft")
    r = client.optimizer_step()
    assert r.lr == 0.0 and r.grad_norm > 0 and r.step == 1, r
    w1 = weights(client)
    assert all(np.array_equal(w0[k], w1[k]) for k in w0)


def test_weight_decay_zero_is_a_value(client):
    """weight_decay = 0: a step without gradients leaves the weights as they
    were; with the default (0.01) it decays them."""
    client.initialize(replace=True, preset="tiny", seed=1, optimizer={"lr": 1e-2, "weight_decay": 0.0})
    w0 = weights(client)
    client.optimizer_step()
    assert all(np.array_equal(w0[k], v) for k, v in client.stream_weights())
    client.initialize(replace=True, preset="tiny", seed=1, optimizer={"lr": 1e-2})
    client.optimizer_step()
    w1 = weights(client)
    k = "model.norm.weight"
    assert np.allclose(w1[k], w0[k] * np.float32(1 - 1e-2 * 0.01), rtol=2e-7, atol=0)


def test_per_step_parameters_apply_once(client):
    """OptimizerStep(lr=0) skips this step's update only; the next step uses
    the configured lr again; a per-step weight_decay applies to its step."""
    client.initialize(replace=True, preset="tiny", seed=2, optimizer={"lr": 1e-3, "weight_decay": 0.0})
    w0 = weights(client)
    client.forward_backward(*batch(), loss="sft")
    r = client.optimizer_step(lr=0.0)
    assert r.lr == 0.0 and r.step == 1, r
    assert all(np.array_equal(w0[k], v) for k, v in client.stream_weights())
    client.forward_backward(*batch(), loss="sft")
    r = client.optimizer_step()
    assert r.lr == pytest.approx(1e-3) and r.step == 2, r
    w2 = weights(client)
    assert any(not np.array_equal(w0[k], w2[k]) for k in w0)
    # A bad per-step value is refused before anything runs.
    expect(SC.INVALID_ARGUMENT, client.optimizer_step, eps=-1.0, field="optimizer.eps")
    expect(SC.INVALID_ARGUMENT, client.optimizer_step, beta1=1.0, field="optimizer.beta1")
    assert client.get_status().step == 2
    # Fresh moments and no gradients: only this step's decay, p *= 1 - 0.1 * 0.5.
    client.initialize(replace=True, preset="tiny", seed=2, optimizer={"lr": 1e-3, "weight_decay": 0.0})
    r = client.optimizer_step(lr=0.1, weight_decay=0.5)
    w3 = weights(client)
    assert r.lr == pytest.approx(0.1)
    for k in w0:
        assert np.allclose(w3[k], w0[k] * np.float32(1 - 0.05), rtol=2e-7, atol=0), k
    r = client.optimizer_step()  # back to weight_decay 0: no change
    assert r.lr == pytest.approx(1e-3)
    assert all(np.array_equal(w3[k], v) for k, v in client.stream_weights())


def test_zero_grad(client):
    """ZeroGrad drops the accumulated gradients: the next step sees norm 0
    and (weight_decay 0) leaves the weights as they were."""
    client.initialize(replace=True, preset="tiny", seed=3, optimizer={"lr": 1e-2, "weight_decay": 0.0})
    w0 = weights(client)
    client.forward_backward(*batch(), loss="sft")
    client.zero_grad()
    r = client.optimizer_step()
    assert r.grad_norm == 0.0 and r.step == 1, r
    assert all(np.array_equal(w0[k], v) for k, v in client.stream_weights())
    client.set_mode("eval")
    expect(SC.FAILED_PRECONDITION, client.zero_grad, field="EVAL")
    client.set_mode("idle")


def test_status_counts_accumulated_calls(client):
    """GetStatus says how many training calls (and tokens) the held
    gradients come from: forward-only calls do not count; a step, ZeroGrad
    and leaving TRAIN reset the count."""
    client.initialize(replace=True, preset="tiny")
    ids, lens = batch()
    s = client.get_status()
    assert (s.accumulated_calls, s.accumulated_tokens) == (0, 0)
    client.forward_backward(ids, lens, loss="sft")
    client.forward_backward(ids[:32], [32], loss="sft")
    client.forward_backward(ids, lens, forward_only=True)
    s = client.get_status()
    assert (s.accumulated_calls, s.accumulated_tokens) == (2, 96), s
    client.optimizer_step()
    assert client.get_status().accumulated_calls == 0
    client.forward_backward(ids, lens, loss="sft")
    client.zero_grad()
    assert client.get_status().accumulated_tokens == 0
    client.set_mode("train")
    client.forward_backward(ids, lens, loss="sft")
    assert client.get_status().accumulated_calls == 1
    client.set_mode("idle")  # leaving TRAIN zeroes the gradients
    s = client.get_status()
    assert (s.accumulated_calls, s.accumulated_tokens) == (0, 0), s


def test_temperature_presence(client):
    """Unset: 1; set to 0: refused (it would divide by zero)."""
    client.initialize(replace=True, preset="tiny")
    ids, lens = batch()
    req = pb.ForwardBackwardRequest(
        input_ids=pb.Tensor(dtype=pb.INT32, shape=[ids.size], data=ids.tobytes()),
        seq_lens=lens, forward_only=True, return_log_probs=True)
    unset = pb.ForwardBackwardResponse.FromString(client.call_raw(
        "/engined.v1.TrainingEngine/ForwardBackward", req.SerializeToString()))
    one = client.forward_backward(ids, lens, forward_only=True, return_log_probs=True,
                                  temperature=1.0)
    assert np.array_equal(np.frombuffer(unset.log_probs.data, np.float32), one["log_probs"])
    req.temperature = 0.0
    try:
        client.call_raw("/engined.v1.TrainingEngine/ForwardBackward", req.SerializeToString())
    except grpc.RpcError as e:
        assert e.code() == SC.INVALID_ARGUMENT and "temperature: must be > 0" in e.details()
    else:
        raise AssertionError("temperature 0 accepted")


OLD_CLIENT = r"""
import sys
import grpc
import numpy as np
import engine_pb2 as o

ch = grpc.insecure_channel(sys.argv[1])


def call(method, req, resp_cls):
    f = ch.unary_unary("/engined.v1.TrainingEngine/" + method,
                       request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=resp_cls.FromString)
    return f(req, timeout=60)


r = call("Initialize", o.InitializeRequest(
    preset="tiny", seed=5, optimizer=o.OptimizerConfig(lr=1e-3, weight_decay=0.0),
    lr_scheduler=o.LrSchedulerConfig(type="constant", min_lr_ratio=0.0)), o.InitializeResponse)
assert r.engine_key == "language_model/native/cpu" and r.num_parameters > 0, r
ids = (np.arange(64, dtype=np.int32) * 7) % 1024
fb = call("ForwardBackward", o.ForwardBackwardRequest(
    input_ids=o.Tensor(dtype=o.INT32, shape=[ids.size], data=ids.tobytes()),
    seq_lens=[32, 32], loss=o.LossSpec(name="sft"), temperature=0.7, return_log_probs=True),
    o.ForwardBackwardResponse)
assert fb.loss > 0 and len(fb.log_probs.data) == 4 * ids.size, fb.loss
st = call("OptimizerStep", o.OptimizerStepRequest(), o.OptimizerStepResponse)
assert st.step == 1 and abs(st.lr - 1e-3) < 1e-12 and st.grad_norm > 0, st
s = call("GetStatus", o.GetStatusRequest(), o.GetStatusResponse)
assert s.step == 1 and s.initialized, s
print("old client ok: loss %.4f grad_norm %.4f" % (fb.loss, st.grad_norm))
"""


def test_client_of_the_first_proto_still_works(tmp_path):
    """A client built from the first engine.proto (its own process, only
    its own stubs) drives a new daemon: same field numbers, encodings and
    method paths. (It cannot set `replace`, so it can initialize a fresh
    daemon but no longer replace an engine: that is the point of the flag.)"""
    from daemon_fixture import Daemon
    daemon = Daemon()
    protoc = shutil.which("protoc")
    if not protoc:
        pytest.skip("protoc not installed (package protobuf-compiler)")
    subprocess.run([protoc, "-I", os.path.join(HERE, "compat/engined/v1"),
                    "--python_out=" + str(tmp_path), "engine.proto"], check=True)
    (tmp_path / "old_client.py").write_text(OLD_CLIENT)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    p = subprocess.run([sys.executable, str(tmp_path / "old_client.py"), daemon.addr],
                       capture_output=True, text=True, timeout=120, env=env)
    code = daemon.stop()
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("old client ok"), p.stdout
    assert code == 0
    print(p.stdout.strip())
