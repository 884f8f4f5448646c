"""EngineGroup (issue 13 item 8): N daemons as one data-parallel engine
through the Python client (engined_client/group.py).

What runs now: the split and merge as pure functions against hand-computed
cases and a brute-force optimum; the agreement checks and GroupError with
fake clients; a group of one address against a real daemon (the same
results as an EngineClient); the split's forward-only outputs and globally
normalized losses from N independent daemons (each initialized alone from
one seed) against one daemon on the whole batch; GroupError with a stopped
daemon. The data-parallel training tests (2 and 3 ranks, SFT and PPO, the
parameters against one daemon on the whole batch, DistStatus) skip while
the daemon refuses groups (CreateGroup or a world_size > 1 Initialize
answered FAILED_PRECONDITION / UNIMPLEMENTED) and run once it forms them.

Run: ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_engine_group.py [-k name]
"""
import itertools

import grpc
import numpy as np
import pytest

from daemon_fixture import Daemon, make_tmp

from engined_client import (EngineClient, EngineError, EngineGroup, ForwardBackwardPlan,
                            ForwardBackwardResult, GroupError, GroupMismatchError,
                            forward_backward_custom, global_loss_options, split_sequences)
from engined_client.results import StepResult

SC = grpc.StatusCode
VOCAB = 1024
# lr 1e-4: Adam normalizes each element, so the fp32 reorderings of data
# parallelism (micro-batch partial sums, the reduce-scatter's order, the
# per-shard norms) move near-cancelling elements by about 3e-3 x lr after
# 3 steps (2.9e-6 at lr 1e-3); the bound below is 1e-6.
INIT = dict(preset="tiny", seed=21, optimizer={"lr": 1e-4, "weight_decay": 0.0})


# --- the split, pure ------------------------------------------------------------

def brute_force_best(lens, k):
    """The least largest-rank token count over every contiguous split."""
    n, best = len(lens), None
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0,) + cuts + (n,)
        m = max(sum(lens[b[i]:b[i + 1]]) for i in range(k))
        best = m if best is None else min(best, m)
    return best


@pytest.mark.parametrize("lens,k,want", [
    ([4, 4, 4, 4], 3, [(0, 2), (2, 3), (3, 4)]),
    ([5, 5, 5, 5, 1], 2, [(0, 2), (2, 5)]),
    ([1, 1, 1, 1, 1, 1, 10], 2, [(0, 6), (6, 7)]),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, [(0, 5), (5, 7), (7, 9)]),
    ([3, 2, 4, 1], 2, [(0, 2), (2, 4)]),
    ([7], 1, [(0, 1)]),
    ([2, 9, 2], 3, [(0, 1), (1, 2), (2, 3)]),
])
def test_split_hand_cases(lens, k, want):
    assert split_sequences(lens, k) == want


def test_split_is_optimal_contiguous_and_complete():
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        k = int(rng.integers(1, n + 1))
        lens = [int(x) for x in rng.integers(1, 40, n)]
        got = split_sequences(lens, k)
        assert len(got) == k
        assert got[0][0] == 0 and got[-1][1] == n
        assert all(a < b for a, b in got), got
        assert all(got[i][1] == got[i + 1][0] for i in range(k - 1)), got
        assert max(sum(lens[a:b]) for a, b in got) == brute_force_best(lens, k), (lens, k)
        assert split_sequences(lens, k) == got  # deterministic


def test_split_refuses_fewer_sequences_than_ranks():
    with pytest.raises(ValueError, match="2 sequences cannot be split over 3 ranks"):
        split_sequences([5, 5], 3)
    with pytest.raises(ValueError, match="every length must be >= 1"):
        split_sequences([5, 0, 2], 2)


def test_global_loss_options_count_like_the_loss_library():
    # No mask: every token but each sequence's first; the 1-token sequence
    # has no loss token and is not counted in global_batch_size.
    assert global_loss_options([3, 2, 4, 1], 2) == {
        "global_num_tokens": 6, "global_batch_size": 3, "loss_scale_factor": 4.0,
        "dp_size": 2}
    mask = np.array([0, 1, 1, 0, 0, 0, 1, 0, 1, 1], np.float32)
    with pytest.raises(ValueError, match="loss_mask: 9 elements, expected 10"):
        global_loss_options([3, 2, 4, 1], 2, mask[:9])
    assert global_loss_options([3, 2, 4, 1], 3, mask) == {
        "global_num_tokens": 5, "global_batch_size": 3, "loss_scale_factor": 4.0,
        "dp_size": 3}
    assert global_loss_options([3, 2], 1) == {}
    assert global_loss_options([3, 2], 2, np.zeros(5, np.float32)) == {}


def test_plan_splits_every_per_token_array_alike():
    lens = [3, 2, 4, 1]
    ids = np.arange(10, dtype=np.int32) + 100
    tgt = np.arange(10, dtype=np.int32) + 500
    mask = np.array([0, 1, 1, 0, 1, 0, 1, 1, 1, 0], np.float32)
    adv = np.linspace(-1, 1, 10).astype(np.float32)
    old = -np.arange(10, dtype=np.float32) / 10
    routed = np.arange(10 * 3 * 2, dtype=np.int64).reshape(10, 3, 2)   # [N, layers, k]
    plan = ForwardBackwardPlan(2, ids, lens, loss={"name": "ppo", "clip_ratio": 0.3},
                               target_ids=tgt, loss_mask=mask, advantages=adv,
                               old_log_probs=old, routed_experts=routed)
    assert plan.seq_ranges == [(0, 2), (2, 4)]
    assert plan.token_ranges == [(0, 5), (5, 10)]
    r0, r1 = plan.requests
    assert r0["seq_lens"] == [3, 2] and r1["seq_lens"] == [4, 1]
    for k, full in (("input_ids", ids), ("target_ids", tgt), ("loss_mask", mask),
                    ("advantages", adv), ("old_log_probs", old), ("routed_experts", routed)):
        assert np.array_equal(r0[k], full[:5]) and np.array_equal(r1[k], full[5:]), k
    assert r0["target_ids"].dtype == np.int32 and r0["input_ids"].dtype == np.int32
    opts = {"clip_ratio": 0.3, "global_num_tokens": 6, "global_batch_size": 3,
            "loss_scale_factor": 4.0, "dp_size": 2}
    assert r0["loss"] == "ppo" and r0["loss_options"] == opts and r1["loss_options"] == opts
    assert plan.dp_size == 2


def test_plan_keeps_the_callers_loss_options():
    plan = ForwardBackwardPlan(2, np.zeros(6, np.int32), [3, 3], loss="sft",
                               loss_options={"global_num_tokens": 40, "dp_size": 4})
    assert plan.requests[0]["loss_options"] == {
        "global_num_tokens": 40, "dp_size": 4, "global_batch_size": 2,
        "loss_scale_factor": 3.0}
    assert plan.dp_size == 4
    # Forward-only without a loss: no loss, no options.
    plan = ForwardBackwardPlan(2, np.zeros(6, np.int32), [3, 3])
    assert "loss" not in plan.requests[0] and plan.dp_size == 1


def test_plan_custom_loss_scales_its_gradients_by_world_size():
    g = np.arange(1, 7, dtype=np.float32)
    plan = ForwardBackwardPlan(3, np.zeros(6, np.int32), [2, 2, 2], loss="custom",
                               grad_log_probs=g, grad_entropy=-g)
    assert plan.requests[0]["loss_options"] == {}
    for r, (t0, t1) in enumerate(plan.token_ranges):
        assert np.array_equal(plan.requests[r]["grad_log_probs"], 3 * g[t0:t1])
        assert np.array_equal(plan.requests[r]["grad_entropy"], -3 * g[t0:t1])
    assert plan.dp_size == 3


def test_plan_refuses_misaligned_arrays():
    with pytest.raises(ValueError, match="seq_lens: sum 5 != 6"):
        ForwardBackwardPlan(2, np.zeros(6, np.int32), [2, 3])
    with pytest.raises(ValueError, match="advantages: 5 elements, expected 6"):
        ForwardBackwardPlan(2, np.zeros(6, np.int32), [3, 3], loss="ppo",
                            advantages=np.zeros(5))
    with pytest.raises(TypeError, match="unknown per-token arrays: bogus"):
        ForwardBackwardPlan(2, np.zeros(6, np.int32), [3, 3], bogus=np.zeros(6))
    with pytest.raises(ValueError, match=r"routed_experts: shape \(5, 2, 2\), expected \[6,"):
        ForwardBackwardPlan(2, np.zeros(6, np.int32), [3, 3],
                            routed_experts=np.zeros((5, 2, 2), np.int32))


def fake_result(loss, metrics, n, base, mbs=1):
    """A rank's result whose outputs are base[...] of its tokens."""
    return ForwardBackwardResult(loss=loss, metrics=metrics, num_micro_batches=mbs,
                                 log_probs=base[0].copy(), entropy=base[1].copy(),
                                 values=None)


def test_merge_restores_the_order_and_combines_metrics():
    lens = [5, 1, 2, 2, 6, 3, 1]
    n = sum(lens)
    plan = ForwardBackwardPlan(3, np.arange(n, dtype=np.int32), lens, loss="ppo",
                               target_ids=np.arange(n, dtype=np.int32)[::-1],
                               advantages=np.ones(n), old_log_probs=np.zeros(n))
    lp = -np.arange(n, dtype=np.float32) / 7
    ent = np.arange(n, dtype=np.float32) * 3
    rank_metrics = [
        {"loss": 0.9, "pg_loss": 0.6, "pg_clipfrac": 0.5, "ppo_kl": 0.1,
         "num_tokens": 4.0, "num_sequences": 2.0},
        {"loss": 0.3, "pg_loss": 0.3, "pg_clipfrac": 0.0, "ppo_kl": 0.4,
         "num_tokens": 6.0, "num_sequences": 3.0},
        {"loss": 0.6, "pg_loss": 0.0, "pg_clipfrac": 1.0, "ppo_kl": 0.0,
         "num_tokens": 0.0, "num_sequences": 2.0},
    ]
    results = [fake_result(rank_metrics[r]["loss"], rank_metrics[r], t1 - t0,
                           (lp[t0:t1], ent[t0:t1]), mbs=r + 1)
               for r, (t0, t1) in enumerate(plan.token_ranges)]
    m = plan.merge(results)
    assert np.array_equal(m.log_probs, lp) and np.array_equal(m.entropy, ent)
    assert m.values is None
    assert m.num_micro_batches == 6
    assert m.loss == pytest.approx((0.9 + 0.3 + 0.6) / 3)
    assert m.metrics == pytest.approx({
        "loss": 0.6, "pg_loss": 0.3, "num_tokens": 10.0, "num_sequences": 7.0,
        "pg_clipfrac": (0.5 * 4 + 0.0 * 6) / 10, "ppo_kl": (0.1 * 4 + 0.4 * 6) / 10})
    assert m.ranks == tuple(results) and m.seq_ranges == tuple(plan.seq_ranges)
    assert m["log_probs"] is m.log_probs
    with pytest.raises(ValueError, match="rank 1: log_probs of 2 elements"):
        bad = list(results)
        bad[1] = fake_result(0.0, {}, 2, (lp[:2], ent[:2]))
        plan.merge(bad)


# --- agreement and errors with fake clients ------------------------------------

class FakeClient:
    def __init__(self, step=None, fail=None):
        self.step, self.fail, self.request_ids = step, fail, []

    def optimizer_step(self, request_id=None, **params):
        self.request_ids.append(request_id)
        if self.fail:
            raise self.fail
        return self.step

    def close(self):
        pass


def fake_group(*clients):
    g = EngineGroup(["127.0.0.1:%d" % (9 + i) for i in range(len(clients))])
    for c in g.clients:
        c.close()
    g.clients = list(clients)
    return g


def test_step_results_must_agree():
    s = StepResult(grad_norm=1.5, skipped=False, lr=1e-3, step=4)
    g = fake_group(FakeClient(s), FakeClient(s), FakeClient(s))
    assert g.optimizer_step(request_id="abc") == s
    assert [c.request_ids for c in g.clients] == [["abc"]] * 3
    g.clients[2].step = StepResult(grad_norm=1.5, skipped=False, lr=1e-3, step=5)
    with pytest.raises(GroupMismatchError, match=r"ranks disagree on step: rank 0 "
                       r"\(127.0.0.1:9\): 4, rank 1 \(127.0.0.1:10\): 4, rank 2 "
                       r"\(127.0.0.1:11\): 5") as e:
        g.optimizer_step()
    assert e.value.field == "step" and e.value.values == {0: 4, 1: 4, 2: 5}
    assert isinstance(e.value, GroupError) and e.value.errors == {}
    g.clients[2].step = StepResult(grad_norm=1.5 * (1 + 1e-8), skipped=False, lr=1e-3, step=4)
    assert g.optimizer_step() == s  # float rounding between ranks is not a mismatch
    g.clients[2].step = StepResult(grad_norm=1.6, skipped=False, lr=1e-3, step=4)
    with pytest.raises(GroupMismatchError, match="grad_norm"):
        g.optimizer_step()
    nan = StepResult(grad_norm=float("nan"), skipped=True, lr=1e-3, step=4)
    g.clients = [FakeClient(nan), FakeClient(nan), FakeClient(nan)]
    assert g.optimizer_step().skipped
    g.close()


def test_group_error_names_every_failed_rank_after_all_returned():
    s = StepResult(grad_norm=1.0, skipped=False, lr=1e-3, step=1)
    g = fake_group(FakeClient(fail=EngineError(SC.UNAVAILABLE, "connection refused")),
                   FakeClient(s),
                   FakeClient(fail=EngineError(SC.FAILED_PRECONDITION, "not initialized")))
    with pytest.raises(GroupError) as e:
        g.optimizer_step(request_id="rid-1")
    err = e.value
    assert str(err) == ("OptimizerStep failed on 2 of 3 ranks: rank 0 (127.0.0.1:9): "
                        "UNAVAILABLE: connection refused; rank 2 (127.0.0.1:11): "
                        "FAILED_PRECONDITION: not initialized")
    assert set(err.errors) == {0, 2} and err.results == {1: s}
    assert err.codes() == {0: SC.UNAVAILABLE, 2: SC.FAILED_PRECONDITION}
    assert err.request_id == "rid-1" and err.method == "OptimizerStep"
    assert [c.request_ids for c in g.clients] == [["rid-1"]] * 3
    g.close()


def test_group_arguments():
    with pytest.raises(TypeError, match="a list of daemon addresses"):
        EngineGroup("127.0.0.1:1")
    with pytest.raises(ValueError, match="at least one daemon"):
        EngineGroup([])
    with EngineGroup(["127.0.0.1:1"]) as g:
        with pytest.raises(TypeError, match="dist is EngineGroup's"):
            g.initialize(preset="tiny", dist={"rank": 0})
    with EngineGroup(["127.0.0.1:1", "127.0.0.1:2"]) as g:
        with pytest.raises(ValueError, match="1 sequences cannot be split over 2 ranks"):
            g.forward_backward(np.zeros(4, np.int32), [4], loss="sft")


# --- real daemons -----------------------------------------------------------------

def batch(seed, lens):
    rng = np.random.default_rng(seed)
    n = sum(lens)
    mask = (rng.random(n) < 0.8).astype(np.float32)
    off = 0
    for s in lens:  # the first token of a sequence has no prediction
        mask[off] = 0
        off += s
    return {"ids": rng.integers(0, VOCAB, n).astype(np.int32), "loss_mask": mask,
            "advantages": rng.normal(0, 1, n).astype(np.float32),
            "old_log_probs": (-rng.random(n) * 5).astype(np.float32),
            "target_ids": rng.integers(0, VOCAB, n).astype(np.int32)}


def weights(stream):
    return {k: v.astype(np.float64) for k, v in stream}


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


@pytest.fixture(scope="module")
def daemons():
    """Four daemons (independent: each initializes alone)."""
    ds = [Daemon() for _ in range(4)]
    yield ds
    codes = [d.stop() for d in ds]
    assert codes == [0] * 4, codes


def test_group_of_one_is_the_daemon_alone(daemons):
    lens = [24, 17, 31, 8]
    b = batch(1, lens)
    with EngineGroup([daemons[0].addr], timeout=120) as g, \
            EngineClient(daemons[1].addr, timeout=120) as c:
        r_g = g.initialize(replace=True, **INIT)
        assert r_g == c.initialize(replace=True, **INIT)
        for _ in range(2):
            fg = g.forward_backward(b["ids"], lens, loss="ppo", loss_mask=b["loss_mask"],
                                    advantages=b["advantages"],
                                    old_log_probs=b["old_log_probs"],
                                    return_log_probs=True, return_entropy=True)
            fc = c.forward_backward(b["ids"], lens, loss="ppo", loss_mask=b["loss_mask"],
                                    advantages=b["advantages"],
                                    old_log_probs=b["old_log_probs"],
                                    return_log_probs=True, return_entropy=True)
            assert fg == fc
            assert g.optimizer_step() == c.optimizer_step()
        assert g.lr_scheduler_step() == c.lr_scheduler_step()
        assert g.set_mode("eval") == c.set_mode("eval")
        assert g.set_mode("idle") == c.set_mode("idle")
        st = g.get_status()
        assert len(st) == 1 and st[0].step == 2 and st[0].dist is None
        assert g.health() == ["SERVING"]
        assert max_diff(weights(g.stream_weights()), weights(c.stream_weights())) == 0.0
        assert g.zero_grad() is None
        saved = g.save_checkpoint("grp1", global_step=2)
        assert len(saved) == 1 and saved[0].bytes > 0
        assert g.load_checkpoint("grp1") == 2
        with pytest.raises(GroupError, match=r"ForwardBackward failed on 1 of 1 ranks: rank 0 "
                           r"\(127\.0\.0\.1:\d+\): INVALID_ARGUMENT: ") as e:
            g.forward_backward(b["ids"], [1], loss="sft")
        assert e.value.codes() == {0: SC.INVALID_ARGUMENT}


LOSSES = [
    ("sft", {}, ("loss_mask",)),
    ("sft", {"loss_agg_mode": "seq-mean-token-mean"}, ("loss_mask",)),
    ("sft", {}, ()),  # no mask: every token but each sequence's first
    ("cross_entropy", {}, ("loss_mask",)),
    ("ppo", {"clip_ratio": 0.1}, ("loss_mask", "advantages", "old_log_probs")),
    ("ppo", {"loss_agg_mode": "seq-mean-token-sum-norm"},
     ("loss_mask", "advantages", "old_log_probs")),
    ("ppo", {"policy_loss": "gspo"}, ("loss_mask", "advantages", "old_log_probs")),
]


@pytest.mark.parametrize("world", [2, 3])
def test_split_forward_equals_one_daemon_on_the_whole_batch(daemons, world):
    """Forward-only on N independent daemons (one seed): the merged
    log-probs / entropy equal one daemon's on the whole batch, and the
    globally normalized losses and metrics combine to the whole batch's."""
    lens = [24, 17, 31, 8, 40, 5, 12]
    b = batch(2, lens)
    clients = [EngineClient(d.addr, timeout=120) for d in daemons[:world + 1]]
    try:
        for c in clients:
            c.initialize(replace=True, **INIT)
        ref, ranks = clients[0], clients[1:]
        for target in (None, b["target_ids"]):
            for name, opts, inputs in LOSSES:
                per_token = {k: b[k] for k in inputs}
                plan = ForwardBackwardPlan(world, b["ids"], lens, loss=name,
                                           loss_options=opts, target_ids=target, **per_token)
                kw = dict(forward_only=True, return_log_probs=True, return_entropy=True)
                merged = plan.merge([c.forward_backward(**plan.requests[r], **kw)
                                     for r, c in enumerate(ranks)])
                whole = ref.forward_backward(b["ids"], lens, loss=name, loss_options=opts,
                                             target_ids=target, **per_token, **kw)
                what = "%s %s target_ids=%s" % (name, opts, target is not None)
                assert float(np.max(np.abs(merged.log_probs - whole.log_probs))) <= 1e-6, what
                assert float(np.max(np.abs(merged.entropy - whole.entropy))) <= 1e-6, what
                assert merged.loss == pytest.approx(whole.loss, rel=1e-6, abs=1e-7), what
                assert merged.metrics.keys() == whole.metrics.keys(), what
                for k, v in whole.metrics.items():
                    assert merged.metrics[k] == pytest.approx(v, rel=1e-6, abs=1e-7), (what, k)
    finally:
        for c in clients:
            c.close()


def test_split_forward_of_a_value_model(daemons):
    """The value loss on a value model's shards: merged values, the
    clipped-fraction mean and the loss as one daemon's on the whole batch."""
    lens = [24, 17, 31, 8, 40, 5]
    b = batch(4, lens)
    clients = [EngineClient(d.addr, timeout=120) for d in daemons[:3]]
    try:
        for c in clients:
            c.initialize(replace=True, model_type="value_model", **INIT)
        ref, ranks = clients[0], clients[1:]
        v = ref.forward_backward(b["ids"], lens, forward_only=True, return_values=True).values
        rng = np.random.default_rng(5)
        per_token = {"loss_mask": b["loss_mask"],
                     "returns": rng.normal(0, 0.5, v.size).astype(np.float32),
                     "old_values": (v + rng.normal(0, 0.6, v.size)).astype(np.float32)}
        kw = dict(forward_only=True, return_values=True)
        plan = ForwardBackwardPlan(2, b["ids"], lens, loss="value", **per_token)
        merged = plan.merge([c.forward_backward(**plan.requests[r], **kw)
                             for r, c in enumerate(ranks)])
        whole = ref.forward_backward(b["ids"], lens, loss="value", **per_token, **kw)
        assert merged.log_probs is None and merged.entropy is None
        assert float(np.max(np.abs(merged.values - whole.values))) <= 1e-6
        assert 0 < whole.metrics["vf_clipfrac"] < 1
        assert merged.loss == pytest.approx(whole.loss, rel=1e-6)
        assert merged.metrics == pytest.approx(whole.metrics, rel=1e-6, abs=1e-7)
    finally:
        for c in clients:
            c.close()


def test_group_forward_over_independent_daemons_sync_and_async(daemons):
    """EngineGroup's own forward_backward (threads) and AsyncEngineGroup's
    (asyncio.gather) over daemons initialized alone: forward-only, the same
    as one daemon on the whole batch; a rank's failure is a GroupError that
    names it and carries the other rank's result."""
    import asyncio

    from engined_client import AsyncEngineGroup

    lens = [24, 17, 31, 8, 40]
    b = batch(3, lens)
    addrs = [d.addr for d in daemons[1:4]]
    for a in [daemons[0].addr] + addrs:
        with EngineClient(a, timeout=120) as c:
            c.initialize(replace=True, **INIT)
    kw = dict(loss="sft", loss_mask=b["loss_mask"], forward_only=True,
              return_log_probs=True, return_entropy=True)
    with EngineClient(daemons[0].addr, timeout=120) as c:
        whole = c.forward_backward(b["ids"], lens, **kw)
    bad = b["ids"].copy()
    bad[-1] = VOCAB + 5  # in the last rank's shard

    with EngineGroup(addrs, timeout=120) as g:
        sync = g.forward_backward(b["ids"], lens, **kw)
        with pytest.raises(GroupError) as e:
            g.forward_backward(bad, lens, **kw)
        assert set(e.value.errors) == {2} and set(e.value.results) == {0, 1}
        assert e.value.codes() == {2: SC.INVALID_ARGUMENT}
        assert "rank 2 (%s): INVALID_ARGUMENT: " % addrs[2] in str(e.value)

    async def run():
        async with AsyncEngineGroup(addrs, timeout=120) as g:
            out = await g.forward_backward(b["ids"], lens, **kw)
            st = await g.get_status()
            with pytest.raises(GroupError) as e:
                await g.forward_backward(bad, lens, **kw)
            return out, st, e.value
    out, st, err = asyncio.run(run())
    assert [s.initialized for s in st] == [True] * 3
    assert set(err.errors) == {2} and set(err.results) == {0, 1}
    for got in (sync, out):
        assert [r.metrics["num_sequences"] for r in got.ranks] == [2.0, 2.0, 1.0]
        assert float(np.max(np.abs(got.log_probs - whole.log_probs))) <= 1e-6
        assert float(np.max(np.abs(got.entropy - whole.entropy))) <= 1e-6
        assert got.loss == pytest.approx(whole.loss, rel=1e-6)
        assert got.metrics == pytest.approx(whole.metrics, rel=1e-6)
    assert sync == out


def test_custom_loss_through_a_group_of_independent_daemons(daemons):
    """forward_backward_custom over a group: the forward-only outputs come
    merged, the gradients go split and scaled by N, and the loss (the
    surrogate sum(g * output), summed over ranks over dp_size) is the whole
    batch's, so each rank got N times its share of the gradients."""
    lens = [24, 17, 31, 8]
    b = batch(6, lens)
    fn = sft_loss_fn(lens, b["loss_mask"])
    for d in daemons[:3]:
        with EngineClient(d.addr, timeout=120) as c:
            c.initialize(replace=True, **INIT)
    with EngineGroup([d.addr for d in daemons[1:3]], timeout=120) as g, \
            EngineClient(daemons[0].addr, timeout=120) as ref:
        lg, fg = forward_backward_custom(g, b["ids"], lens, fn)
        lr, fr = forward_backward_custom(ref, b["ids"], lens, fn)
        assert lg == pytest.approx(lr, rel=1e-6)
        assert fg.loss == pytest.approx(fr.loss, rel=1e-6)
        assert fg.metrics["num_sequences"] == 4.0


def test_group_error_with_a_stopped_daemon():
    ds = [Daemon(), Daemon()]
    try:
        with EngineGroup([d.addr for d in ds], timeout=30) as g:
            for d in ds:
                with EngineClient(d.addr, timeout=60) as c:
                    c.initialize(**INIT)
            assert [s.initialized for s in g.get_status()] == [True, True]
            assert ds[1].stop() == 0
            with pytest.raises(GroupError) as e:
                g.get_status()
            err = e.value
            assert set(err.errors) == {1} and err.codes() == {1: SC.UNAVAILABLE}
            assert err.results[0].initialized  # rank 0 answered before the raise
            assert ("GetStatus failed on 1 of 2 ranks: rank 1 (%s): UNAVAILABLE: "
                    % ds[1].addr) in str(err)
            # A state-changing call: rank 0 runs its shard, rank 1 fails; the
            # error comes once both returned, with the id to call again with.
            lens = [9, 9, 9]
            with pytest.raises(GroupError) as e:
                g.forward_backward(np.arange(27, dtype=np.int32), lens, loss="sft",
                                   request_id="fb-1")
            err = e.value
            assert set(err.errors) == {1} and err.request_id == "fb-1"
            assert err.results[0].metrics["num_tokens"] == 16.0  # two of the 3 sequences
            st0 = g.clients[0].get_status()
            assert st0.last_request_id == "fb-1" and not st0.busy
    finally:
        for d in ds:
            d.stop()


# --- data parallelism (skips while the daemon refuses groups) --------------------

def refused(e):
    """The daemon's refusals of a group before its data-parallel engine
    lands: CreateGroup without a collective backend (or a daemon without
    the RPC), Initialize refusing world_size > 1. Any other failure fails."""
    def why(err):
        code, details = err.code(), err.details() or ""
        if code == SC.UNIMPLEMENTED:
            return True
        if code != SC.FAILED_PRECONDITION:
            return False
        if e.method == "CreateGroup":
            return "collective backend" in details
        return e.method == "Initialize" and "dist.world_size" in details
    return bool(e.errors) and all(why(err) for err in e.errors.values())


def initialize_or_skip(group, **kw):
    try:
        return group.initialize(**kw)
    except GroupError as e:
        if refused(e):
            pytest.skip("this daemon refuses data-parallel groups (%s)" % e)
        raise


@pytest.fixture
def dist_daemons(request):
    """world + 1 daemons sharing one --dist-store-root (Gloo's FileStore):
    the group's ranks, and a reference daemon last."""
    world = request.param
    store = make_tmp(prefix="engined-dist-")
    ds = [Daemon("--dist-store-root", store) for _ in range(world + 1)]
    yield ds
    codes = [d.stop() for d in ds]
    assert codes == [0] * len(ds), codes


def step_batch(seed):
    lens = [24, 17, 31, 8, 40, 5, 12, 20]
    return lens, batch(seed, lens)


def sft_loss_fn(lens, mask):
    """SFT's token-mean in torch, for forward_backward_custom."""
    torch = pytest.importorskip("torch")
    m = torch.as_tensor(mask, dtype=torch.float64)

    def fn(outputs):
        return -(outputs["log_probs"] * m).sum() / m.sum()
    return fn


@pytest.mark.parametrize("dist_daemons,loss,reduce,preset", [
    (2, "sft", False, "tiny"), (3, "sft", False, "tiny"), (2, "ppo", False, "tiny"),
    (3, "ppo", False, "tiny"), (2, "custom", False, "tiny"),
    # The gradients reduced during the training call's backward pass, in
    # buckets of 64 KiB (about 15 for the tiny preset), not by the step.
    (2, "ppo", True, "tiny"), (3, "sft", True, "tiny"), (2, "custom", True, "tiny"),
    # The small preset (28M parameters: 111 MB of gradients, 5 buckets of
    # the default 25 MiB), both ways.
    (2, "ppo", False, "small"), (3, "sft", True, "small")],
    indirect=["dist_daemons"])
def test_data_parallel_training_equals_one_daemon(dist_daemons, loss, reduce, preset):
    world = len(dist_daemons) - 1
    with EngineGroup([d.addr for d in dist_daemons[:world]], timeout=300) as g, \
            EngineClient(dist_daemons[world].addr, timeout=300) as ref:
        init = dict(INIT, preset=preset,
                    optimizer={"lr": 1e-4, "weight_decay": 0.01, "clip_grad": 1.0})
        bucket = (64 << 10) if reduce and preset == "tiny" else None
        r_g = initialize_or_skip(g, dist_timeout_s=120, dist_bucket_bytes=bucket, **init)
        r_ref = ref.initialize(**init)
        assert (r_g.num_parameters, r_g.num_tensors) == (r_ref.num_parameters,
                                                         r_ref.num_tensors)
        assert g.backend in ("gloo", "nccl") and g.group_id
        w0 = weights(ref.stream_weights())
        assert max_diff(weights(g.stream_weights()), w0) == 0.0
        for step in range(3):
            lens, b = step_batch(10 + step)
            if loss == "custom":
                # A client-side loss: its whole-batch gradients, split and
                # scaled by N by the group, train as on one daemon.
                fn = sft_loss_fn(lens, b["loss_mask"])
                lg, fg = forward_backward_custom(g, b["ids"], lens, fn, reduce_gradients=reduce)
                lr, fr = forward_backward_custom(ref, b["ids"], lens, fn)
                assert lg == pytest.approx(lr, rel=1e-6, abs=1e-7)
                assert fg.loss == pytest.approx(fr.loss, rel=1e-6, abs=1e-7)
                sg, sr = g.optimizer_step(), ref.optimizer_step()
                assert sg.step == sr.step == step + 1
                assert sg.grad_norm == pytest.approx(sr.grad_norm, rel=1e-5)
                continue
            if loss == "sft":
                per_token = {"loss_mask": b["loss_mask"]}
            else:
                old = ref.forward_backward(b["ids"], lens, forward_only=True,
                                           return_log_probs=True).log_probs
                per_token = {"loss_mask": b["loss_mask"], "advantages": b["advantages"],
                             "old_log_probs": old + np.float32(0.05)}
            fg = g.forward_backward(b["ids"], lens, loss=loss, return_log_probs=True,
                                    reduce_gradients=reduce, **per_token)
            fr = ref.forward_backward(b["ids"], lens, loss=loss, return_log_probs=True,
                                      **per_token)
            # Relative: the small preset's log-probs reach -10 (vocabulary
            # 8192), where 1e-6 is one ulp of fp32.
            assert float(np.max(np.abs(fg.log_probs - fr.log_probs) /
                                np.maximum(1, np.abs(fr.log_probs)))) <= 1e-6
            assert fg.loss == pytest.approx(fr.loss, rel=1e-6, abs=1e-7)
            assert fg.metrics["num_tokens"] == fr.metrics["num_tokens"]
            sg, sr = g.optimizer_step(), ref.optimizer_step()
            assert sg.step == sr.step == step + 1
            assert sg.grad_norm == pytest.approx(sr.grad_norm, rel=1e-5)
        w_ref = weights(ref.stream_weights())
        assert max_diff(w0, w_ref) > 1e-4, "the steps must move the weights"
        for r, c in enumerate(g.clients):  # every rank holds the same parameters
            w = weights(c.stream_weights())
            d = np.concatenate([np.abs(w[k] - w_ref[k]).ravel() for k in w_ref])
            print("rank %d: max |param - one daemon| %.3g, %d of %d above 1e-6"
                  % (r, d.max(), int((d > 1e-6).sum()), d.size))
            # Rounding, not a wrong reduction: a few elements whose
            # gradient is near AdamW's eps move by up to lr x (error / eps)
            # (seen: 3-5 elements, up to 3.5e-6, with gcc and clang); a
            # wrong normalization would move most elements by ~lr.
            assert int((d > 1e-6).sum()) <= d.size // 10000, "rank %d" % r
            assert d.max() <= 0.1 * 3 * INIT["optimizer"]["lr"], "rank %d" % r
        statuses = g.get_status()
        n_params = r_g.num_parameters
        largest = max(v.size for v in w_ref.values())
        shards = []
        for r, st in enumerate(statuses):
            assert st.step == 3 and st.dist is not None, r
            assert (st.dist.rank, st.dist.world_size) == (r, world)
            assert st.dist.backend == g.backend and not st.dist.broken
            shards.append(st.dist.optimizer_shard_parameters)
        # ZeRO-1: the AdamW moments split over the ranks, about 1/N each
        # (within one tensor of it), together all of them (a flat split may
        # pad each shard: at most 4096 elements).
        assert n_params <= sum(shards) <= n_params + 4096 * world, shards
        assert all(abs(s - n_params / world) <= largest for s in shards), shards
        assert all(st.dist.optimizer_bytes > 0 for st in statuses)
        for st in statuses:  # the last training call's reduction, bucket by bucket
            reduced = 4 * world * st.dist.optimizer_shard_parameters if reduce else 0
            assert st.dist.reduce_bytes == reduced
            assert st.dist.bucket_bytes == (bucket or 25 << 20)
            assert (st.dist.reduce_buckets >= reduced // (bucket or 25 << 20)) and (
                st.dist.reduce_buckets > 0) == reduce
            assert 0 <= st.dist.reduce_wait_s and 0 <= st.dist.reduce_s


@pytest.mark.parametrize("dist_daemons", [2], indirect=True)
def test_data_parallel_group_calls(dist_daemons):
    """The group's other calls on a real group: modes, the schedule,
    ZeroGrad, and a batch too small for the ranks."""
    with EngineGroup([d.addr for d in dist_daemons[:2]], timeout=300) as g:
        initialize_or_skip(g, dist_timeout_s=120, **INIT)
        assert g.set_mode("train").mode == 2
        lens, b = step_batch(1)
        g.forward_backward(b["ids"], lens, loss="sft")
        assert g.zero_grad() is None
        assert g.set_mode("idle").mode == 1
        assert float(g.lr_scheduler_step()) == pytest.approx(1e-4)
        # Every rank saves; these daemons have separate checkpoint roots,
        # so rank 0 writes rank 1's optimizer shard too, from the slices
        # rank 1 sends (its reply: 0 bytes); loading, rank 0 reads rank
        # 1's part and sends it. (One shared root, where each rank writes
        # its own: test_group_checkpoint.py.)
        saved = g.save_checkpoint("dp", global_step=1)
        assert len(saved) == 2 and saved[0].bytes > 0 and saved[1].bytes == 0
        before = weights(g.stream_weights())
        g.forward_backward(b["ids"], lens, loss="sft")
        g.optimizer_step()
        assert max_diff(weights(g.stream_weights()), before) > 0
        assert g.load_checkpoint("dp") == 1
        for c in g.clients:
            assert max_diff(weights(c.stream_weights()), before) == 0.0
        with pytest.raises(ValueError, match="cannot be split over 2 ranks"):
            g.forward_backward(b["ids"][:24], [24], loss="sft")
        assert [s.dist.rank for s in g.get_status()] == [0, 1]


@pytest.mark.parametrize("dist_daemons", [2, 3], indirect=True)
def test_world_sizes_within_the_split_noise(dist_daemons):
    """Issue 30: a group's parameters after 3 AdamW steps at lr 1e-3 differ
    from one daemon's on the whole batch no more than that daemon differs
    from itself fed the same batch in the ranks' shares (one call each,
    the whole batch's normalizers): the ranks compute what the split
    daemon computes (the mean over ranks taken as the loss writes its
    gradients, native_grad_scale), and only the order of the ranks' sum
    differs. Before, each rank's gradients were scaled by W and the step
    divided by W, exact only for W a power of two: at W = 3, 56 elements
    moved by up to 2.7e-5 against the split run's 1.7e-6."""
    world = len(dist_daemons) - 1
    split_daemon = Daemon()
    try:
        parity_against_split(dist_daemons, world, split_daemon)
    finally:
        assert split_daemon.stop() == 0


def parity_against_split(dist_daemons, world, split_daemon):
    init = dict(preset="tiny", seed=21, optimizer={"lr": 1e-3, "weight_decay": 0.0})
    with EngineGroup([d.addr for d in dist_daemons[:world]], timeout=300) as g, \
            EngineClient(dist_daemons[world].addr, timeout=300) as whole, \
            EngineClient(split_daemon.addr, timeout=300) as split:
        initialize_or_skip(g, dist_timeout_s=120, **init)
        whole.initialize(**init)
        split.initialize(**init)
        for step in range(3):
            lens, b = step_batch(10 + step)
            g.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
            whole.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
            opts = dict(global_loss_options(lens, world, b["loss_mask"]), dp_size=1)
            off = np.cumsum([0] + lens)
            for a, z in split_sequences(lens, world):
                part = slice(off[a], off[z])
                split.forward_backward(b["ids"][part], lens[a:z], loss="sft", loss_options=opts,
                                       loss_mask=b["loss_mask"][part])
            g.optimizer_step(), whole.optimizer_step(), split.optimizer_step()
        w_whole, w_split = weights(whole.stream_weights()), weights(split.stream_weights())
        noise = max_diff(w_split, w_whole)
        for r, c in enumerate(g.clients):
            w = weights(c.stream_weights())
            print("rank %d: group - whole %.3g, split - whole %.3g, group - split %.3g"
                  % (r, max_diff(w, w_whole), noise, max_diff(w, w_split)))
            assert max_diff(w, w_split) <= max(noise, 1e-6), r
            assert max_diff(w, w_whole) <= noise + 1e-6, r
