"""Custom losses end to end (issue 12, item 7): a loss written in torch on
the client, differentiated there and sent back as the "custom" loss, trains
exactly like the server-side loss. The client-side losses are the
independent torch reference of the loss library (tests/loss/loss_ref.py,
verl's formulas). Needs torch (Debian's python3-torch).

Run: ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_custom_loss.py [-k name]
"""
import os
import sys

import grpc
import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "loss"))
import loss_ref  # noqa: E402

from engined_client import EngineError, forward_backward_custom  # noqa: E402

SC = grpc.StatusCode
LENS = [24, 17, 31, 8]
N = sum(LENS)


def arrays(seed):
    rng = np.random.default_rng(seed)
    mask = (rng.random(N) < 0.8).astype(np.float32)
    off = 0
    for n in LENS:          # the first token of a sequence has no prediction
        mask[off] = 0
        off += n
    return {
        "ids": rng.integers(0, 1024, N).astype(np.int32),
        "loss_mask": mask,
        "advantages": rng.normal(0, 1, N).astype(np.float32),
        "returns": rng.normal(0, 0.5, N).astype(np.float32),
    }


def weights(client):
    return {k: v.copy() for k, v in client.stream_weights()}


def max_diff(a, b):
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


def init(client, model_type="language_model"):
    client.initialize(replace=True, preset="tiny", seed=21, model_type=model_type,
                      optimizer={"lr": 1e-3, "weight_decay": 0.0, "clip_grad": 0.0})


def reference_loss(name, options, extra):
    """loss_fn over the engine's outputs with the reference objective."""
    spec = loss_ref.spec_of(name, list(options.items()))
    req = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in extra.items()}

    def fn(outputs):
        packed = dict(req)
        packed.update(outputs)
        loss, _ = loss_ref.objective(LENS, packed, spec)
        return loss
    return fn


def compare(client, name, options, extra, model_type="language_model", tol=1e-5):
    """Server-side loss vs the same loss through forward_backward_custom:
    the weights after two optimizer steps agree within tol. (AdamW's first
    step moves every weight by lr times the sign of its gradient; the second
    depends on the gradients' magnitudes too, so it compares them.)"""
    a = arrays(5)
    init(client, model_type)
    w0 = weights(client)
    srv = []
    for _ in range(2):
        srv.append(client.forward_backward(a["ids"], LENS, loss=name, loss_options=options,
                                           **extra)["loss"])
        client.optimizer_step()
    w_srv = weights(client)
    init(client, model_type)
    assert max_diff(w0, weights(client)) == 0.0
    cus = []
    for _ in range(2):
        loss, res = forward_backward_custom(client, a["ids"], LENS,
                                            reference_loss(name, options, extra),
                                            model_type=model_type)
        cus.append(loss)
        client.optimizer_step()
    w_cus = weights(client)
    moved = max_diff(w0, w_srv)
    diff = max_diff(w_srv, w_cus)
    assert moved > 1e-4, "the steps must move the weights (%g)" % moved
    assert diff <= tol, "custom vs server %s: max |dW| %.3g (steps moved %.3g)" % (name, diff,
                                                                                moved)
    for x, y in zip(cus, srv):
        assert abs(x - y) <= 1e-5 * max(1.0, abs(y)), (cus, srv)
    print("%s: server losses %s, client losses %s, max |dW| %.2e of %.2e moved"
          % (name, ["%.6f" % x for x in srv], ["%.6f" % x for x in cus], diff, moved))


def test_custom_equals_server_sft(client):
    a = arrays(5)
    compare(client, "sft", {}, {"loss_mask": a["loss_mask"]})


def test_custom_equals_server_ppo_with_entropy_and_kl(client):
    """Vanilla dual-clip PPO with an entropy bonus and a k3 KL term; old and
    reference log-probs are the model's own, perturbed so that clipping and
    the KL term are active."""
    a = arrays(5)
    init(client)
    lp = client.forward_backward(a["ids"], LENS, forward_only=True,
                                 return_log_probs=True)["log_probs"]
    rng = np.random.default_rng(9)
    old = (lp + rng.normal(0, 0.3, N)).astype(np.float32)
    ref = (lp + rng.normal(0, 0.2, N)).astype(np.float32)
    extra = {"loss_mask": a["loss_mask"], "advantages": a["advantages"],
             "old_log_probs": old, "ref_log_probs": ref}
    options = {"policy_loss": "vanilla", "clip_ratio": 0.2, "entropy_coeff": 0.01,
               "kl_coef": 0.1, "kl_type": "k3"}
    compare(client, "ppo", options, extra)


def test_custom_equals_server_value_loss(client):
    a = arrays(5)
    init(client, "value_model")
    v = client.forward_backward(a["ids"], LENS, forward_only=True,
                                return_values=True)["values"]
    rng = np.random.default_rng(4)
    old_v = (v + rng.normal(0, 0.6, N)).astype(np.float32)
    extra = {"loss_mask": a["loss_mask"], "returns": a["returns"], "old_values": old_v}
    compare(client, "value", {"cliprange_value": 0.5}, extra, model_type="value_model")


def test_custom_loss_rules(client):
    """custom needs at least one gradient, of the model's kind of output."""
    a = arrays(5)
    init(client)
    try:
        client.forward_backward(a["ids"], LENS, loss="custom")
    except EngineError as e:
        assert e.code() == SC.INVALID_ARGUMENT and "needs at least one" in e.details()
    else:
        raise AssertionError("custom without gradients accepted")
    try:
        client.forward_backward(a["ids"], LENS, loss="custom",
                                grad_values=np.ones(N, np.float32))
    except EngineError as e:
        assert e.code() == SC.INVALID_ARGUMENT and "value_model" in e.details()
    else:
        raise AssertionError("grad_values accepted by a language model")


def test_target_ids(client):
    """target_ids: entry t scores target_ids[t]; equal to input_ids it is
    the default; another target changes exactly the entries it names."""
    a = arrays(5)
    init(client)
    ids = a["ids"]
    base = client.forward_backward(ids, LENS, forward_only=True, return_log_probs=True)
    same = client.forward_backward(ids, LENS, forward_only=True, return_log_probs=True,
                                   target_ids=ids)
    assert np.array_equal(base["log_probs"], same["log_probs"])
    tgt = ids.copy()
    tgt[5] = (tgt[5] + 1) % 1024
    other = client.forward_backward(ids, LENS, forward_only=True, return_log_probs=True,
                                    target_ids=tgt)
    changed = np.nonzero(other["log_probs"] != base["log_probs"])[0]
    assert list(changed) == [5], changed
    try:
        client.forward_backward(ids, LENS, forward_only=True, target_ids=ids[:-1])
    except EngineError as e:
        assert e.code() == SC.INVALID_ARGUMENT and "target_ids" in e.details()
    else:
        raise AssertionError("a short target_ids was accepted")
