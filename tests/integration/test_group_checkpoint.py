"""Checkpoints of a data-parallel group whose daemons share one checkpoint
root (one filesystem): each rank writes its own optimizer shard, and a
group of another world size loads them resharded (2 -> 3 -> 1), checked
against the files themselves through PyPI's safetensors reader.

The daemons with separate roots (rank 0 writes and reads the shards of
the others) are test_engine_group.py's test_data_parallel_group_calls.

Run: ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
     build/venv-pypi/bin/python -m pytest tests/integration/test_group_checkpoint.py
"""
import json
import os

import numpy as np
import pytest
import safetensors.numpy as st

from daemon_fixture import Daemon, make_tmp
from engined_client import EngineClient, EngineGroup
from test_engine_group import INIT, initialize_or_skip, step_batch, weights


@pytest.fixture
def shared():
    """Four daemons sharing one Gloo store and one checkpoint root."""
    store = make_tmp(prefix="engined-dist-")
    root = make_tmp(prefix="engined-ckpt-")
    ds = [Daemon("--dist-store-root", store, "--checkpoint-root", root) for _ in range(4)]
    yield root, ds
    codes = [d.stop() for d in ds]
    assert codes == [0] * len(ds), codes


def shards(root, name, world):
    """The moments of a group's checkpoint, its shards concatenated in
    rank order, and each shard's metadata."""
    flat = {"exp_avg": [], "exp_avg_sq": []}
    metas = []
    for r in range(world):
        path = os.path.join(root, name, "optimizer-%05d-of-%05d.safetensors" % (r, world))
        t = st.load_file(path)
        assert sorted(t) == ["exp_avg", "exp_avg_sq"], path
        for k in flat:
            flat[k].append(t[k])
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            metas.append(json.loads(f.read(n))["__metadata__"])
    assert not os.path.exists(os.path.join(root, name, "optimizer.safetensors"))
    return {k: np.concatenate(v) for k, v in flat.items()}, metas


def one_engine(root, name, order):
    """One engine's optimizer file, flattened in the parameter order."""
    t = st.load_file(os.path.join(root, name, "optimizer.safetensors"))
    return {k: np.concatenate([t["%s.%s" % (k, p)].ravel() for p in order])
            for k in ("exp_avg", "exp_avg_sq")}


def test_shards_written_by_each_rank_reshard_2_to_3_to_1(shared):
    root, ds = shared
    with EngineGroup([d.addr for d in ds[:2]], timeout=300) as g:
        r = initialize_or_skip(g, dist_timeout_s=120, **INIT)
        for step in range(2):
            lens, b = step_batch(30 + step)
            g.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
            g.optimizer_step()
        w2 = weights(g.stream_weights())
        saved = g.save_checkpoint("two", global_step=2)
    P = r.num_parameters
    # Each rank wrote its own shard: both replies count bytes.
    assert len(saved) == 2 and all(s.bytes > 0 for s in saved), saved
    m2, metas = shards(root, "two", 2)
    S = -(-P // 2)
    assert [m["shard_offset"] for m in metas] == ["0", str(S)]
    assert all(m["num_parameters"] == str(P) and m["world_size"] == "2" for m in metas)
    assert m2["exp_avg"].size == P and np.count_nonzero(m2["exp_avg_sq"]) > P // 2
    state = json.load(open(os.path.join(root, "two", "engine_state.json")))
    assert state["world_size"] == 2 and state["optimizer_step"] == 2

    # 2 -> 3: three ranks load the two shards, split at other offsets,
    # and save three that hold the same values bit for bit.
    with EngineGroup([d.addr for d in ds[:3]], timeout=300) as g3:
        initialize_or_skip(g3, dist_timeout_s=120, replace=True, **INIT)
        assert g3.load_checkpoint("two") == 2
        assert weights(g3.stream_weights()).keys() == w2.keys()
        for c in g3.clients:
            w = weights(c.stream_weights())
            assert all(np.array_equal(w[k], w2[k]) for k in w2)
        saved3 = g3.save_checkpoint("three", global_step=2)
        assert len(saved3) == 3 and all(s.bytes > 0 for s in saved3)
        st3 = g3.get_status()
        assert [s.dist.optimizer_shard_parameters for s in st3] == [-(-P // 3)] * 3
    m3, metas3 = shards(root, "three", 3)
    assert [m["shard_offset"] for m in metas3] == [str(i * -(-P // 3)) for i in range(3)]
    for k in m2:
        assert np.array_equal(m3[k], m2[k]), k

    # 3 -> 1: one daemon loads the three shards and saves one engine's file.
    with EngineClient(ds[3].addr, timeout=300) as one:
        one.initialize(**INIT)
        assert one.load_checkpoint("three") == 2
        w1 = weights(one.stream_weights())
        assert all(np.array_equal(w1[k], w2[k]) for k in w2)
        one.save_checkpoint("one", global_step=2)
        lens, b = step_batch(40)   # and it trains on from there
        one.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
        assert one.optimizer_step().step == 3
    m1 = one_engine(root, "one", list(w2))
    for k in m2:
        assert np.array_equal(m1[k], m2[k]), k
