"""Integration tests: a data-parallel group's failures through the wire
(docs/DISTRIBUTED.md). A rank that never arrives makes Initialize answer
DEADLINE_EXCEEDED within its timeout and leaves the daemon as it was; a
rank killed (SIGKILL) makes the others' OptimizerStep answer UNAVAILABLE
or DEADLINE_EXCEEDED, GetStatus report the group broken and later steps
FAILED_PRECONDITION, while the daemon keeps serving forward passes and
initializes alone again. CreateGroup's and Initialize's dist checks.
Needs the CPU collective backend (Gloo); skipped without it.

Every wait here is bounded by the group's timeout (a few seconds): the
tests assert outcomes, never how fast they came.
"""
import concurrent.futures as cf

import grpc
import numpy as np
import pytest

from daemon_fixture import Daemon, make_tmp
from rpc_expect import expect

from engined_client import EngineClient, EngineError

SC = grpc.StatusCode
TIMEOUT_S = 5.0



@pytest.fixture
def pair():
    store = make_tmp(prefix="engined-dist-")
    ds = [Daemon("--dist-store-root", store) for _ in range(2)]
    cs = [EngineClient(d.addr, timeout=120) for d in ds]
    try:
        try:
            cs[0].create_group(2)
        except EngineError as e:
            if e.code() == SC.FAILED_PRECONDITION and "no collective backend" in e.details():
                pytest.skip("this build has no CPU collective backend: " + e.details())
            raise
        yield ds, cs
    finally:
        for c in cs:
            c.close()
        for d in ds:
            d.stop()


def batch(seed, n=32):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 200, n).astype(np.int32), [n // 2, n // 2]


def init_group(cs, world=2):
    gid = cs[0].create_group(world).group_id
    with cf.ThreadPoolExecutor(len(cs)) as ex:
        futs = [ex.submit(c.initialize, preset="tiny", seed=5, replace=True,
                          dist={"rank": r, "world_size": world, "group_id": gid,
                                "timeout_s": TIMEOUT_S})
                for r, c in enumerate(cs)]
        return [f.result() for f in futs]


def test_create_group_and_dist_checks(pair):
    _, cs = pair
    g = cs[0].create_group(3)
    assert g.backend == "gloo" and len(g.group_id) > 0
    assert cs[0].create_group(3).group_id != g.group_id
    expect(SC.INVALID_ARGUMENT, cs[0].create_group, 1, field="world_size")
    expect(SC.FAILED_PRECONDITION, cs[0].create_group, 2, device="nosuch",
           field="no collective backend")
    expect(SC.INVALID_ARGUMENT, cs[0].initialize, preset="tiny", replace=True,
           dist={"rank": 2, "world_size": 2, "group_id": g.group_id}, field="dist.rank")
    expect(SC.INVALID_ARGUMENT, cs[0].initialize, preset="tiny", replace=True,
           dist={"rank": 0, "world_size": 2, "group_id": b""}, field="dist.group_id")
    # One rule for the id and one for world_size, whatever the group size.
    for world in (1, 2):
        expect(SC.INVALID_ARGUMENT, cs[0].initialize, preset="tiny", replace=True,
               dist={"rank": 0, "world_size": world, "group_id": b"x" * 129},
               field="dist.group_id: 129 bytes")
    expect(SC.INVALID_ARGUMENT, cs[0].initialize, preset="tiny", replace=True,
           dist={"rank": 0, "world_size": -1, "group_id": b""}, field="dist.world_size: -1")
    expect(SC.INVALID_ARGUMENT, cs[0].initialize, preset="tiny", replace=True,
           dist={"rank": 0, "world_size": 2, "group_id": g.group_id, "timeout_s": 0.0},
           field="dist.timeout_s")
    assert not cs[0].get_status().initialized


def test_rank_that_never_arrives_times_out(pair):
    _, cs = pair
    cs[0].initialize(preset="tiny", seed=1)
    before = cs[0].get_status()
    gid = cs[0].create_group(2).group_id
    e = expect(SC.DEADLINE_EXCEEDED, cs[0].initialize, preset="tiny", replace=True,
               dist={"rank": 0, "world_size": 2, "group_id": gid, "timeout_s": 2.0})
    assert "rank" in e.details() or "peer" in e.details(), e.details()
    # The engine it had is untouched and serves on.
    st = cs[0].get_status()
    assert st.initialized and st.dist is None and st.num_parameters == before.num_parameters
    ids, lens = batch(1)
    cs[0].forward_backward(ids, lens, loss="sft")
    cs[0].optimizer_step()


def test_killed_rank_fails_the_step_and_the_survivor_goes_on(pair):
    ds, cs = pair
    init_group(cs)
    st = [c.get_status() for c in cs]
    assert [s.dist.rank for s in st] == [0, 1] and not any(s.dist.broken for s in st)
    ids, lens = batch(2)
    for c in cs:
        c.set_mode("train")
        c.forward_backward(ids[:16], lens[:1], loss="sft")
    w_before = dict(cs[0].stream_weights())
    ds[1].proc.kill()          # SIGKILL: its sockets close
    ds[1].proc.wait()
    with pytest.raises(EngineError) as ei:
        cs[0].optimizer_step()
    e = ei.value
    assert e.code() in (SC.UNAVAILABLE, SC.DEADLINE_EXCEEDED), (e.code(), e.details())
    st = cs[0].get_status()
    assert st.dist.broken and st.accumulated_calls == 0
    # Parameters as they were; later steps refused at once.
    w_after = dict(cs[0].stream_weights())
    assert all(np.array_equal(w_before[k], w_after[k]) for k in w_before)
    cs[0].forward_backward(ids[:16], lens[:1], loss="sft")
    expect(SC.FAILED_PRECONDITION, cs[0].optimizer_step, field="broken")
    # Forward passes need no group; alone again with replace.
    out = cs[0].forward_backward(ids, lens, forward_only=True, return_log_probs=True)
    assert out.log_probs.shape == (32,)
    cs[0].initialize(preset="tiny", seed=5, replace=True)
    assert cs[0].get_status().dist is None
    cs[0].forward_backward(ids, lens, loss="sft")
    assert cs[0].optimizer_step().step == 1
