"""Hostile input over the wire (issue 11): sizes that once crashed the
daemon get a precise INVALID_ARGUMENT or RESOURCE_EXHAUSTED, the daemon
keeps serving and the engine stays usable. Each case is the request a
remote attacker would send, through the Python client.

Run: ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_hostile.py [-k name]
"""
import json

import grpc
import numpy as np

from rpc_expect import expect_details as expect

SC = grpc.StatusCode
INT64_MAX = (1 << 63) - 1

TINY_LLAMA = {"model_type": "llama", "vocab_size": 16, "hidden_size": 2,
              "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1,
              "num_key_value_heads": 1, "tie_word_embeddings": True}



def still_usable(client):
    """The daemon answers and a real step still runs on the engine."""
    assert client.health() == "SERVING"
    client.initialize(replace=True, preset="tiny", seed=1)
    ids = np.arange(64, dtype=np.int32)
    out = client.forward_backward(ids, [32, 32], loss="sft")
    assert np.isfinite(out["loss"]) and out["loss"] > 0


def test_config_dimensions_out_of_range(client):
    """The config of the report (intermediate_size 2^61: a signed overflow,
    then a heap overflow in the random init) and its siblings."""
    for key, value in [("intermediate_size", 2305843009213693952),
                       ("vocab_size", 1 << 40), ("hidden_size", 1 << 20),
                       ("num_hidden_layers", 10 ** 7), ("num_attention_heads", 1 << 20),
                       ("max_position_embeddings", 1 << 40)]:
        cfg = dict(TINY_LLAMA, **{key: value})
        if key == "num_attention_heads":
            cfg["num_key_value_heads"] = value
        msg = expect(SC.INVALID_ARGUMENT, client.initialize, hf_config_json=json.dumps(cfg),
                     field=key)
        assert "must be in [1, " in msg, msg
    still_usable(client)


def test_config_too_large_for_memory(client):
    """Within the bounds but 2^38 parameters (1 TiB of fp32): refused for
    memory, not by a crash."""
    cfg = dict(TINY_LLAMA, vocab_size=1 << 22, hidden_size=1 << 16, num_attention_heads=512,
               num_key_value_heads=512)
    msg = expect(SC.RESOURCE_EXHAUSTED, client.initialize, hf_config_json=json.dumps(cfg),
                 replace=True)
    # Refused from the estimate, before anything is allocated.
    assert "parameters need about" in msg and "GiB free" in msg, msg
    still_usable(client)


def test_micro_batch_budget_out_of_range(client):
    """max_tokens_per_micro_batch = INT64_MAX once overflowed the planner:
    refused by ForwardBackward and by Initialize alike."""
    client.initialize(replace=True, preset="tiny")
    ids = np.arange(20, dtype=np.int32)
    for budget in (INT64_MAX, -1, (1 << 30) + 1):
        expect(SC.INVALID_ARGUMENT, client.forward_backward, ids, [5, 15], forward_only=True,
               max_tokens_per_micro_batch=budget, field="max_tokens_per_micro_batch")
        expect(SC.INVALID_ARGUMENT, client.initialize, preset="tiny",
               max_tokens_per_micro_batch=budget, field="max_tokens_per_micro_batch")
    # The largest budget allowed plans fine.
    out = client.forward_backward(ids, [5, 15], forward_only=True,
                                  max_tokens_per_micro_batch=1 << 30, return_log_probs=True)
    assert out["num_micro_batches"] == 1
    still_usable(client)


def test_optimizer_ranges_named_once(client):
    """Each optimizer rule has one message (engine_init_config_check), the
    same from the wire as from the engine library."""
    for field, value, text in [("lr", -1.0, "optimizer.lr: must be a finite number >= 0"),
                               ("eps", -1e-8, "optimizer.eps: must be a finite number > 0"),
                               ("beta1", 1.0, "optimizer.beta1: must be in [0, 1)"),
                               ("weight_decay", float("nan"),
                                "optimizer.weight_decay: must be a finite number >= 0"),
                               ("clip_grad", float("inf"), "optimizer.clip_grad: must be a finite")]:
        msg = expect(SC.INVALID_ARGUMENT, client.initialize, preset="tiny",
                     optimizer={field: value})
        assert msg.startswith(text), msg
    still_usable(client)


def test_optimizer_step_without_gradients_is_a_step(client):
    """Documented (README, proto): with all-zero gradients AdamW's update
    is 0 but the decoupled weight decay applies, p *= 1 - lr * wd, and the
    step counts, as torch.optim.AdamW does."""
    lr, wd = 1e-2, 0.1
    client.initialize(replace=True, preset="tiny", seed=3, optimizer={"lr": lr, "weight_decay": wd})
    w0 = {k: v.copy() for k, v in client.stream_weights()}
    r = client.optimizer_step()
    assert r.step == 1 and not r.skipped and r.grad_norm == 0.0, r
    w1 = dict(client.stream_weights())
    for k, a in w0.items():
        want = (a * np.float32(1 - lr * wd)).astype(np.float32)
        assert np.allclose(w1[k], want, rtol=2e-7, atol=0), k
        assert not np.array_equal(w1[k], a) or not a.any(), k


def raw_call(client, method, payload):
    """A unary call with hand-made request bytes (grpcio's protobuf refuses
    to build such strings)."""
    f = client.channel.unary_unary("/engined.v1.TrainingEngine/" + method)
    return f(payload, timeout=30)


def test_strings_must_be_utf8_without_nul(client, daemon):
    """A NUL once cut a path ('nul\\0/../../evil' saved as 'nul'); a
    non-UTF-8 path was echoed back and broke the client's parse. Both are
    INVALID_ARGUMENT naming the field; nothing is saved."""
    client.initialize(replace=True, preset="tiny")
    for path, why in [(b"nul\x00/../../evil", "path: contains a NUL byte"),
                      (b"run/\xff\xfe", "path: is not valid UTF-8")]:
        payload = bytes([0x0A, len(path)]) + path  # SaveCheckpointRequest.path = 1
        try:
            raw_call(client, "SaveCheckpoint", payload)
        except grpc.RpcError as e:
            assert e.code() == SC.INVALID_ARGUMENT and e.details() == why, (e.code(), e.details())
        else:
            raise AssertionError("saved %r" % path)
    import os
    assert not os.path.exists(os.path.join(daemon.ckpt_root, "nul")), os.listdir(daemon.ckpt_root)
    # Nested: LossSpec.name inside ForwardBackwardRequest.loss (field 11).
    from engined_client import pb
    ok = pb.ForwardBackwardRequest(loss=pb.LossSpec(name="sft")).SerializeToString()
    field = [f for f in pb.ForwardBackwardRequest.DESCRIPTOR.fields if f.name == "loss"][0]
    inner = bytes([0x0A, 3]) + b"s\x00t"
    bad = bytes([field.number << 3 | 2, len(inner)]) + inner
    assert ok  # the valid form serializes
    try:
        raw_call(client, "ForwardBackward", bad)
    except grpc.RpcError as e:
        assert e.code() == SC.INVALID_ARGUMENT and e.details() == "loss.name: contains a NUL byte", \
            e.details()
    else:
        raise AssertionError("accepted a NUL in loss.name")
    # Valid UTF-8 beyond ASCII is a path like any other.
    r = client.save_checkpoint("run/\u00e9t\u00e9")
    assert r.path == "run/\u00e9t\u00e9"
    still_usable(client)
