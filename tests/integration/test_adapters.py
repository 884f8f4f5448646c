"""LoRA adapters through the daemon (issue 27): CreateAdapter and
DeleteAdapter, the `adapter` field of every call that trains, reads or
exports state, the [lora] bounds, tokens limited to adapters and each
adapter's own request-id space. The numerics of LoRA itself (parity with
PEFT) are tests/verl/'s; here the daemon's contract, on the tiny preset.

Run: ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_adapters.py [-k name]
"""
import os

import grpc
import numpy as np
import pytest

from daemon_fixture import Daemon, make_tmp
from rpc_expect import expect, expect_details

from engined_client import EngineClient

SC = grpc.StatusCode
TOK_ALICE = "alice-0123456789abcdef0123456789"
TOK_BOB = "bob-0123456789abcdef0123456789ab"
TOK_ADMIN = "admin-0123456789abcdef0123456789"
TOK_AUDIT = "audit-0123456789abcdef012345678"


def batch():
    ids = (np.arange(48, dtype=np.int32) * 37 + 5) % 1024
    return ids, [20, 28]


def frozen(c, **kw):
    c.initialize(replace=True, preset="tiny", seed=3, frozen_base=True,
                 optimizer={"lr": 1e-2, "weight_decay": 0.0}, **kw)


@pytest.fixture
def c(client):
    """The module's daemon, a fresh frozen tiny base without adapters."""
    frozen(client)
    assert client.get_status().adapters == ()
    return client


def own_daemon(*args, **kw):
    d = Daemon(*args, **kw)
    return d, EngineClient(d.addr, timeout=120)


def stop(d, c):
    c.close()
    assert d.stop() == 0


# --- lifecycle --------------------------------------------------------------

def test_create_needs_a_frozen_base(client):
    client.initialize(replace=True, preset="tiny")
    msg = expect_details(SC.FAILED_PRECONDITION, client.create_adapter, "a", rank=4)
    assert "frozen_base" in msg, msg
    assert client.get_status().adapters == ()


def test_create_list_delete(c):
    r = c.create_adapter("a", rank=4, alpha=16, target_modules="all-linear", seed=1)
    assert (r.name, r.rank, r.alpha, r.use_rslora) == ("a", 4, 16.0, False)
    assert r.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                "up_proj", "down_proj")
    # tiny: 4 layers, hidden 128 (q, o: 128x128; k, v: 64x128 with 2 of 4
    # heads), intermediate 384: rank x (in + out) per module.
    per_layer = 4 * ((128 + 128) * 2 + (128 + 64) * 2 + (128 + 384) * 2 + (384 + 128))
    assert (r.num_parameters, r.num_tensors) == (4 * per_layer, 4 * 7 * 2)
    b = c.create_adapter("b")  # PEFT's defaults: r 8, alpha 8, q_proj and v_proj
    assert (b.rank, b.alpha, b.target_modules) == (8, 8.0, ("q_proj", "v_proj"))
    c.create_adapter("c-2.x", rank=2, target_modules=["model.layers.0.self_attn.o_proj"],
                     use_rslora=True)
    st = c.get_status()
    assert st.adapters == ("a", "b", "c-2.x")
    base_params = st.num_parameters
    assert c.get_status(adapter="a").num_parameters == r.num_parameters
    assert c.get_status(adapter="a").adapters == st.adapters
    c.delete_adapter("b")
    assert c.get_status().adapters == ("a", "c-2.x")
    expect(SC.NOT_FOUND, c.delete_adapter, "b", field="name")
    c.create_adapter("b", rank=2)  # the name is free again, at the end
    assert c.get_status().adapters == ("a", "c-2.x", "b")
    assert c.get_status().num_parameters == base_params
    # Replacing the engine deletes its adapters.
    frozen(c)
    assert c.get_status().adapters == ()
    expect(SC.NOT_FOUND, c.get_status, adapter="a", field="adapter")


def test_duplicate_name(c):
    c.create_adapter("a", rank=4)
    msg = expect_details(SC.ALREADY_EXISTS, c.create_adapter, "a", rank=8, field="name")
    assert "'a'" in msg
    assert c.get_status().adapters == ("a",)
    assert c.get_status(adapter="a").num_parameters == c.create_adapter("z", rank=4).num_parameters


def test_bad_arguments(c):
    for kw, field in [(dict(name=""), "name"), (dict(name=".hidden"), "name"),
                      (dict(name="a b"), "name"), (dict(name="x" * 65), "name"),
                      (dict(name="a", rank=0), "rank"), (dict(name="a", rank=-2), "rank"),
                      (dict(name="a", alpha=-1.0), "alpha"),
                      (dict(name="a", alpha=float("nan")), "alpha"),
                      (dict(name="a", target_modules=["q_proj", "wq"]), "target_modules[1]"),
                      (dict(name="a", target_modules=[]), "target_modules"),
                      (dict(name="a", optimizer={"lr": -1.0}), "lr"),
                      (dict(name="a", lr_scheduler={"type": "step"}), "lr_scheduler.type"),
                      # tiny's k_proj is 64 x 128: rank at most 64.
                      (dict(name="a", rank=65, target_modules=["k_proj"]), "rank")]:
        expect(SC.INVALID_ARGUMENT, c.create_adapter, field=field, **kw)
    expect(SC.PERMISSION_DENIED, c.create_adapter, "a", peft_dir="../x", field="peft_dir")
    expect(SC.NOT_FOUND, c.create_adapter, "a", peft_dir="none-such", field="peft_dir")
    assert c.get_status().adapters == ()
    c.create_adapter("a", rank=64, target_modules=["k_proj"])  # the largest rank fits


def test_unknown_adapter_on_each_call(c):
    ids, lens = batch()
    calls = [
        (c.forward_backward, (ids, lens), dict(loss="sft")),
        (c.forward_backward, (ids, lens), dict(forward_only=True, return_log_probs=True)),
        (c.optimizer_step, (), {}),
        (c.zero_grad, (), {}),
        (c.lr_scheduler_step, (), {}),
        (c.set_mode, ("train",), {}),
        (c.to_device, ("cpu",), {}),
        (c.get_status, (), {}),
        (lambda **kw: list(c.stream_weights(**kw)), (), {}),
    ]
    c.create_adapter("known", rank=2)
    for fn, args, kw in calls:
        msg = expect_details(SC.NOT_FOUND, fn, *args, adapter="nope", field="adapter", **kw)
        assert "no adapter named 'nope'" in msg, msg
    msg = expect_details(SC.NOT_FOUND, c.get_status, adapter="y" * 300, field="adapter")
    assert "at most 64" in msg
    assert c.get_status(adapter="known").step == 0


# --- training -----------------------------------------------------------------

def test_adapter_trains_and_the_base_stays(c):
    ids, lens = batch()

    def base_log_probs():
        return c.forward_backward(ids, lens, forward_only=True, return_log_probs=True).log_probs
    before = base_log_probs()
    c.create_adapter("a", rank=8, target_modules="all-linear", seed=5)
    # A new adapter (B = 0) scores exactly as the base.
    new = c.forward_backward(ids, lens, forward_only=True, return_log_probs=True, adapter="a")
    assert np.array_equal(new.log_probs, before)
    losses = []
    for _ in range(5):
        losses.append(c.forward_backward(ids, lens, loss="sft", adapter="a").loss)
        s = c.optimizer_step(adapter="a")
        assert not s.skipped and s.grad_norm > 0
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    # The base model: bit for bit what it was; it trains nothing itself.
    assert np.array_equal(base_log_probs(), before)
    assert c.get_status().step == 0
    expect(SC.FAILED_PRECONDITION, c.forward_backward, ids, lens, loss="sft")
    expect(SC.FAILED_PRECONDITION, c.optimizer_step)
    # The adapter's weights: its own tensors in PEFT's names, B no longer 0.
    w = dict(c.stream_weights(adapter="a"))
    assert len(w) == 4 * 7 * 2
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    assert w[name].shape == (128, 8) and np.abs(w[name]).max() > 0
    assert set(dict(c.stream_weights(names=["model.norm.weight"]))) == {"model.norm.weight"}


def test_each_adapter_has_its_own_state(c):
    ids, lens = batch()
    c.create_adapter("a", rank=4)
    c.create_adapter("b", rank=4, optimizer={"lr": 1e-3},
                     lr_scheduler={"type": "linear", "warmup_steps": 10, "total_steps": 20})
    for _ in range(3):
        c.forward_backward(ids, lens, loss="sft", adapter="a")
        c.optimizer_step(adapter="a")
    c.forward_backward(ids, lens, loss="sft", adapter="b")
    c.forward_backward(ids, lens, loss="sft", adapter="b")
    st_b = c.get_status(adapter="b")
    assert (st_b.step, st_b.accumulated_calls, st_b.accumulated_tokens) == (0, 2, 2 * 48)
    c.zero_grad(adapter="b")
    assert c.get_status(adapter="b").accumulated_calls == 0
    c.lr_scheduler_step(adapter="b")
    st_a, st_b, base = (c.get_status(adapter="a"), c.get_status(adapter="b"),
                        c.get_status())
    assert (st_a.step, st_b.step, base.step) == (3, 0, 0)
    assert (st_a.sched_step, st_b.sched_step) == (0, 1)
    assert st_a.lr == pytest.approx(1e-2) and st_b.lr == pytest.approx(1e-3 * 1 / 10)
    assert st_a.num_parameters == st_b.num_parameters < base.num_parameters
    # Mode and placement are the adapter's own.
    assert c.set_mode("train", adapter="a").mode.name == "TRAIN"
    assert c.get_status(adapter="a").mode.name == "TRAIN"
    assert c.get_status(adapter="b").mode.name != "TRAIN"
    c.set_mode("idle", adapter="a")
    assert c.to_device("cpu", adapter="b") == c.get_status(adapter="b").placement


def test_same_request_id_on_two_adapters(c):
    ids, lens = batch()
    c.create_adapter("a", rank=4, request_id="make")
    c.create_adapter("b", rank=4, request_id="make")
    for name in ("a", "b"):
        c.forward_backward(ids, lens, loss="sft", adapter=name, request_id="fb-1")
        assert c.optimizer_step(adapter=name, request_id="step-1").step == 1
    # A repeat on one adapter gets that adapter's recorded outcome.
    assert c.optimizer_step(adapter="a", request_id="step-1").step == 1
    assert c.get_status(adapter="a").step == 1
    assert c.get_status(adapter="a").last_request_id == "step-1"
    assert c.get_status(adapter="b").last_request_id == "step-1"
    # The base's ids are a space of their own too.
    c.zero_grad(request_id="step-1")
    assert c.get_status().last_request_id == "step-1"
    # Within one adapter an id still names one call.
    expect(SC.INVALID_ARGUMENT, c.zero_grad, adapter="a", request_id="step-1",
           field="engined-request-id")


# --- bounds -------------------------------------------------------------------

def test_max_adapters():
    d, c = own_daemon("-o", "lora.max_adapters=2")
    try:
        frozen(c)
        c.create_adapter("a", rank=4)
        c.create_adapter("b", rank=4)
        msg = expect_details(SC.RESOURCE_EXHAUSTED, c.create_adapter, "c", rank=4,
                             field="max_adapters")
        assert "max_adapters = 2" in msg and "'c'" in msg, msg
        assert c.get_status().adapters == ("a", "b")
        ids, lens = batch()
        c.forward_backward(ids, lens, loss="sft", adapter="b")
        assert c.optimizer_step(adapter="b").step == 1
        c.delete_adapter("a")
        c.create_adapter("c", rank=4)
        assert c.get_status().adapters == ("b", "c")
    finally:
        stop(d, c)


def test_max_adapter_bytes():
    # tiny, rank 4 on q_proj: 4 layers x 4 x (128 + 128) = 4096 parameters,
    # 65536 bytes; the bound holds one such adapter and a half.
    d, c = own_daemon("-o", "lora.max_adapter_bytes=98304")
    try:
        frozen(c)
        assert c.create_adapter("a", rank=4, target_modules="q_proj").num_parameters == 4096
        msg = expect_details(SC.RESOURCE_EXHAUSTED, c.create_adapter, "b", rank=4,
                             target_modules="q_proj", field="max_adapter_bytes")
        assert ("max_adapter_bytes = 98304" in msg and "65536 bytes" in msg
                and "'b'" in msg), msg
        assert c.get_status().adapters == ("a",)
        c.create_adapter("b", rank=2, target_modules="q_proj")  # 32768 bytes: fits
        c.delete_adapter("a")
        c.create_adapter("c", rank=4, target_modules="q_proj")
        assert c.get_status().adapters == ("b", "c")
        ids, lens = batch()
        c.forward_backward(ids, lens, loss="sft", adapter="c")
        assert c.optimizer_step(adapter="c").step == 1
    finally:
        stop(d, c)


# --- tokens limited to adapters -----------------------------------------------

def test_token_limited_to_adapters():
    tmp = make_tmp(prefix="engined-tok-")
    tf = os.path.join(tmp, "tokens")
    with open(tf, "w") as f:
        f.write("alice:%s full adapters=a\n" % TOK_ALICE)
        f.write("bob:%s adapters=b,b2\n" % TOK_BOB)
        f.write("audit:%s read-only adapters=a\n" % TOK_AUDIT)
        f.write("admin:%s\n" % TOK_ADMIN)
    os.chmod(tf, 0o600)
    d = Daemon("--token-file", tf)
    admin = EngineClient(d.addr, timeout=60, token=TOK_ADMIN)
    alice = EngineClient(d.addr, timeout=60, token=TOK_ALICE)
    bob = EngineClient(d.addr, timeout=60, token=TOK_BOB)
    audit = EngineClient(d.addr, timeout=60, token=TOK_AUDIT)
    ids, lens = batch()
    try:
        expect(SC.PERMISSION_DENIED, alice.initialize, preset="tiny", frozen_base=True,
               field="adapter")
        frozen(admin)
        alice.create_adapter("a", rank=4)
        bob.create_adapter("b", rank=4)
        admin.create_adapter("c", rank=4)
        # Another tenant's adapter: refused, naming it.
        for fn, args, kw in [(alice.forward_backward, (ids, lens), dict(loss="sft")),
                             (alice.optimizer_step, (), {}), (alice.zero_grad, (), {}),
                             (alice.get_status, (), {}),
                             (lambda **kw: list(alice.stream_weights(**kw)), (), {}),
                             (alice.delete_adapter, (), {})]:
            if fn == alice.delete_adapter:
                msg = expect_details(SC.PERMISSION_DENIED, fn, "b", field="name")
            else:
                msg = expect_details(SC.PERMISSION_DENIED, fn, *args, adapter="b",
                                     field="adapter", **kw)
            assert "'b'" in msg and "alice" in msg, msg
        expect(SC.PERMISSION_DENIED, alice.create_adapter, "b2", rank=4, field="name")
        # The base model: neither trained, read nor exported.
        for fn, args, kw in [(alice.forward_backward, (ids, lens), dict(forward_only=True)),
                             (lambda: list(alice.stream_weights()), (), {}),
                             (alice.set_mode, ("train",), {}),
                             (alice.save_checkpoint, ("x",), {}),
                             (alice.request_share, (), {})]:
            msg = expect_details(SC.PERMISSION_DENIED, fn, *args, **kw)
            assert "base model" in msg and "adapter" in msg, msg
        # Its own adapter: everything; GetStatus lists its own only.
        alice.forward_backward(ids, lens, loss="sft", adapter="a")
        assert alice.optimizer_step(adapter="a").step == 1
        assert len(dict(alice.stream_weights(adapter="a"))) == 4 * 2 * 2
        assert alice.get_status().adapters == ("a",)
        assert alice.get_status(adapter="a").step == 1
        assert bob.get_status().adapters == ("b",)
        assert admin.get_status().adapters == ("a", "b", "c")
        assert alice.health() == "SERVING"
        # read-only and limited: reads adapter a only.
        assert audit.get_status(adapter="a").step == 1
        assert len(dict(audit.stream_weights(adapter="a"))) == 4 * 2 * 2
        expect(SC.PERMISSION_DENIED, audit.optimizer_step, adapter="a")
        expect(SC.PERMISSION_DENIED, audit.get_status, adapter="b", field="adapter")
        bob.delete_adapter("b")
        assert admin.get_status().adapters == ("a", "c")
    finally:
        for x in (admin, alice, bob, audit):
            x.close()
        assert d.stop() == 0
    log = d.log_text()
    for t in (TOK_ALICE, TOK_BOB, TOK_ADMIN, TOK_AUDIT):
        assert t not in log


def test_bad_token_file_adapters():
    tmp = make_tmp(prefix="engined-tok-")
    for line, why in [("a:%s adapters=" % TOK_ALICE, "adapters="),
                      ("a:%s adapters=x,,y" % TOK_ALICE, "''"),
                      ("a:%s adapters=.x" % TOK_ALICE, "'.x'"),
                      ("a:%s adapters=x, " % TOK_ALICE, "ends with"),
                      ("a:%s adapters=x adapters=y" % TOK_ALICE, "twice"),
                      ("a:%s full read-only" % TOK_ALICE, "too many fields"),
                      ("a:%s adapters=x full full" % TOK_ALICE, "too many fields"),
                      ("a:%s read-only extra" % TOK_ALICE, "too many fields")]:
        tf = os.path.join(tmp, "tokens")
        with open(tf, "w") as f:
            f.write(line + "\n")
        os.chmod(tf, 0o600)
        with pytest.raises(RuntimeError) as e:
            Daemon("--token-file", tf)
        assert why in str(e.value), (line, str(e.value)[-500:])
