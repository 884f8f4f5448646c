"""dist.zero_stage 2 and 3 (issue 30): a group that shards its gradients
(2) or its parameters too (3) trains as one daemon does, within that
daemon's own split noise; the ranks agree bit for bit; GetStatus's Memory
shows each family's share; bad stages and what is not built yet for
stage 3 are refused by name. Skipped where the daemon has no Gloo."""
import asyncio
import concurrent.futures as cf
import os
import shutil
import signal
import time

import grpc
import numpy as np
import pytest

from daemon_fixture import Daemon, make_tmp
from engined_client import (AsyncEngineGroup, EngineClient, EngineError, EngineGroup, GroupError,
                            global_loss_options, split_sequences)
from engined_client.memory import rank_memory
from test_engine_group import (dist_daemons, initialize_or_skip, max_diff,  # noqa: F401
                               step_batch, weights)

SC = grpc.StatusCode
INIT = dict(preset="tiny", seed=21, optimizer={"lr": 1e-3, "weight_decay": 0.0})
# Micro-batches of at most 40 tokens: the ranks' shares of step_batch
# (157 tokens) make 2 to 4 of them, unequal between ranks, so a rank with
# fewer walks the missing ones' gathers and reductions.
MB = 40


def on_all(g, fn):
    """fn(client) on every rank at once (a ZeRO-3 group's calls are
    collectives)."""
    with cf.ThreadPoolExecutor(len(g.clients)) as ex:
        return list(ex.map(fn, g.clients))


def group_weights(g):
    """Every rank's exported parameters, the ranks asked at once (with
    zero_stage 3 each tensor is gathered: a collective)."""
    return on_all(g, lambda c: weights(c.stream_weights()))


# A mixture of experts of the tiny preset's size (issue 31): each layer's
# experts are one run of its part's range, gathered and reduced with it.
MOE = dict(hf_config_json={
    "model_type": "mixtral", "vocab_size": 1024, "hidden_size": 64,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
    "max_position_embeddings": 512}, seed=21, optimizer=INIT["optimizer"])


@pytest.mark.parametrize("dist_daemons,stage,init", [
    (2, 3, INIT), (3, 3, INIT), (2, 2, INIT), (3, 2, INIT), (2, 3, MOE)],
    indirect=["dist_daemons"], ids=["2-3", "3-3", "2-2", "3-2", "2-3-experts"])
def test_sharded_group_equals_one_daemon(dist_daemons, stage, init):
    """3 AdamW steps at lr 1e-3: the group computes what one daemon fed
    the ranks' shares computes (the split run), but for the order of the
    sums over ranks and micro-batches (each micro-batch's gradients are
    reduced as its backward goes): its parameters differ from the split
    run's no more than the split run differs from the whole batch's (the
    split noise, or 1e-6), and from the whole batch's within that noise
    plus 1e-6, as ZeRO-1's do (test_engine_group). Measured with these
    40-token micro-batches: W = 2, group - split 4.5e-7 against a split
    noise of 1.38e-6 (ZeRO-1: 8.4e-7); W = 3, 7.5e-7 against 2.9e-6. Its
    losses are within 1e-7 relative, and every rank exports the same
    tensors bit for bit. The same for a mixture of experts at stage 3."""
    world = len(dist_daemons) - 1
    split_daemon = Daemon()
    try:
        with EngineGroup([d.addr for d in dist_daemons[:world]], timeout=300) as g, \
                EngineClient(dist_daemons[world].addr, timeout=300) as whole, \
                EngineClient(split_daemon.addr, timeout=300) as split:
            initialize_or_skip(g, dist_timeout_s=120, dist_zero_stage=stage, **init)
            whole.initialize(**init)
            split.initialize(**init)
            for step in range(3):
                lens, b = step_batch(10 + step)
                kw = dict(loss="sft", max_tokens_per_micro_batch=MB)
                r_g = g.forward_backward(b["ids"], lens, loss_mask=b["loss_mask"], **kw)
                r_w = whole.forward_backward(b["ids"], lens, loss_mask=b["loss_mask"], **kw)
                assert r_g.loss == pytest.approx(r_w.loss, rel=1e-7, abs=0)
                opts = dict(global_loss_options(lens, world, b["loss_mask"]), dp_size=1)
                off = np.cumsum([0] + lens)
                for a, z in split_sequences(lens, world):
                    part = slice(off[a], off[z])
                    split.forward_backward(b["ids"][part], lens[a:z], loss_options=opts,
                                           loss_mask=b["loss_mask"][part], **kw)
                s_g, s_w = g.optimizer_step(), whole.optimizer_step()
                split.optimizer_step()
                assert s_g.grad_norm == pytest.approx(s_w.grad_norm, rel=1e-6)
            w_whole, w_split = weights(whole.stream_weights()), weights(split.stream_weights())
            noise = max_diff(w_split, w_whole)
            ws = group_weights(g)
            for r, w in enumerate(ws):
                print("zero_stage %d rank %d: group - whole %.3g, split - whole %.3g, "
                      "group - split %.3g" % (stage, r, max_diff(w, w_whole), noise,
                                              max_diff(w, w_split)))
                assert max_diff(w, w_split) <= max(noise, 1e-6), r
                assert max_diff(w, w_whole) <= noise + 1e-6, r
                assert all(np.array_equal(w[k], ws[0][k]) for k in w), r
    finally:
        assert split_daemon.stop() == 0


def part_floats(shapes):
    """The largest layer, the embedding and the head (final norm, LM
    head; a tied head has none of its own) in floats, from the tensors'
    shapes by name."""
    layers, embed, head = {}, 0, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        if name.startswith("model.layers."):
            l = int(name.split(".")[2])
            layers[l] = layers.get(l, 0) + n
        elif name == "model.embed_tokens.weight":
            embed = n
        else:
            head += n
    return max(layers.values()), embed, head


@pytest.mark.parametrize("dist_daemons", [3], indirect=True)
def test_memory_per_family(dist_daemons):
    """GetStatus's Memory: the parameters as this rank holds them, its
    gradients and moments, and the part buffers, for each stage, equal
    to engined_client.memory's accounting (docs/SCALING.md's tables).
    The tiny preset's shapes come from its exported tensors."""
    world = 3
    addrs = [d.addr for d in dist_daemons[:world]]
    with EngineClient(dist_daemons[world].addr, timeout=300) as alone:
        P = alone.initialize(**INIT).num_parameters
        parts = part_floats({k: v.shape for k, v in alone.stream_weights()})
        m = alone.get_status().memory
        assert (m.param_bytes, m.grad_bytes, m.optimizer_bytes, m.gathered_bytes) == \
            rank_memory(P, 1, 1, *parts)
    for stage in (1, 2, 3):
        with EngineGroup(addrs, timeout=300) as g:
            initialize_or_skip(g, dist_timeout_s=120, dist_zero_stage=stage, replace=True,
                               **INIT)
            for st in g.get_status():
                m = st.memory
                assert (m.param_bytes, m.grad_bytes, m.optimizer_bytes, m.gathered_bytes) == \
                    rank_memory(P, world, stage, *parts), stage


@pytest.mark.parametrize("stage", [0, 4, -1, 1 << 20])
def test_bad_zero_stage_is_refused_by_name(stage):
    """Before any collective: a lone Initialize naming a group that does
    not exist is refused for its stage at once, not after the group's
    timeout; so is a stage without a group."""
    d = Daemon()
    try:
        with EngineClient(d.addr, timeout=30) as c:
            for dist in ({"rank": 0, "world_size": 2, "group_id": b"\x01" * 16,
                          "timeout_s": 600, "zero_stage": stage},
                         {"zero_stage": stage}):
                with pytest.raises(EngineError) as e:
                    c.initialize(dist=dist, **INIT)
                assert e.value.code() == SC.INVALID_ARGUMENT
                assert "dist.zero_stage: %d" % stage in e.value.details()
            assert not c.get_status().initialized
            assert c.initialize(dist={"zero_stage": 3}, **INIT).num_parameters > 0
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("dist_daemons", [2], indirect=True)
def test_what_stage_3_does_not_build_yet_is_refused(dist_daemons):
    """Sample needs the whole parameters on a rank: UNIMPLEMENTED naming
    zero_stage, and the group trains on afterwards."""
    with EngineGroup([d.addr for d in dist_daemons[:2]], timeout=300) as g:
        initialize_or_skip(g, dist_timeout_s=120, dist_zero_stage=3, **INIT)
        with pytest.raises(EngineError) as e:
            g.clients[0].sample(np.array([1, 2, 3], np.int32), [3], max_tokens=2)
        assert e.value.code() == SC.UNIMPLEMENTED, e.value
        assert "dist.zero_stage 3" in e.value.details()
        lens, b = step_batch(3)
        g.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
        assert g.optimizer_step().step == 1


@pytest.fixture
def shared_root_daemons():
    """Five daemons on one Gloo store and one checkpoint root (the
    ranks of a group of 2 and of 3; the last also alone)."""
    store = make_tmp(prefix="engined-dist-")
    root = make_tmp(prefix="engined-ckpt-")
    ds = [Daemon("--dist-store-root", store, "--checkpoint-root", root) for _ in range(5)]
    yield ds
    assert [d.stop() for d in ds] == [0] * 5


def test_stage_3_checkpoint_reshards_and_loads_alone(shared_root_daemons):
    """A ZeRO-3 group of 2 saves (each rank its optimizer slice, rank 0 the
    model file with each tensor gathered in turn); a ZeRO-3 group of 3 and
    one daemon alone load it: the parameters bit for bit, and the moments
    with them (one more identical step agrees within 1e-5 at lr 1e-3,
    where zeroed or misplaced moments move elements by about lr)."""
    ds = shared_root_daemons
    lens, b = step_batch(8)
    kw = dict(loss="sft", loss_mask=b["loss_mask"])
    with EngineGroup([d.addr for d in ds[:2]], timeout=300) as g2:
        initialize_or_skip(g2, dist_timeout_s=120, dist_zero_stage=3, **INIT)
        g2.forward_backward(b["ids"], lens, **kw)
        g2.optimizer_step()
        g2.save_checkpoint("z3", global_step=1)
        want = group_weights(g2)[0]
        # EngineGroup's own stream: rank 0's, the others read beside it,
        # also when the caller stops after one tensor.
        assert max_diff(weights(g2.stream_weights()), want) == 0
        next(iter(g2.stream_weights()))
        assert max_diff(weights(g2.stream_weights()), want) == 0
    with EngineGroup([d.addr for d in ds[2:5]], timeout=300) as g3, \
            EngineClient(ds[4].addr, timeout=300) as alone:
        g3.initialize(dist_timeout_s=120, dist_zero_stage=3, **INIT)
        assert on_all(g3, lambda c: c.load_checkpoint("z3")) == [1, 1, 1]
        for w in group_weights(g3):
            assert all(np.array_equal(w[k], want[k]) for k in want)
        g3.forward_backward(b["ids"], lens, **kw)
        assert g3.optimizer_step().step == 2
        w3 = group_weights(g3)[0]
        alone.initialize(replace=True, **INIT)
        assert alone.load_checkpoint("z3") == 1
        got = weights(alone.stream_weights())
        assert all(np.array_equal(got[k], want[k]) for k in want)
        alone.forward_backward(b["ids"], lens, **kw)
        assert alone.optimizer_step().step == 2
        assert max_diff(weights(alone.stream_weights()), w3) < 1e-5


@pytest.fixture
def three_daemons():
    """Three daemons on one Gloo store; the test kills the second."""
    store = make_tmp(prefix="engined-dist-")
    ds = [Daemon("--dist-store-root", store) for _ in range(3)]
    yield ds
    codes = [d.stop() for d in ds]
    assert codes[0] == 0 and codes[2] == 0, codes


def test_killed_rank_breaks_a_sharded_call_and_the_group_reforms(three_daemons):
    """Rank 1 killed (SIGKILL): rank 0's next ZeRO-3 ForwardBackward, whose
    every pass gathers from rank 1, answers UNAVAILABLE or
    DEADLINE_EXCEEDED within the group's timeout and reports the group
    broken; its slice is kept (Memory unchanged, later calls refused at
    once), and a new group with another daemon in rank 1's place trains."""
    ds = three_daemons
    with EngineGroup([d.addr for d in ds[:2]], timeout=120) as g:
        initialize_or_skip(g, dist_timeout_s=5, dist_zero_stage=3, **INIT)
        lens, b = step_batch(4)
        g.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
        g.optimizer_step()
        c0 = g.clients[0]
        before = c0.get_status().memory
        ds[1].proc.kill()
        ds[1].proc.wait()
        with pytest.raises(EngineError) as e:
            c0.forward_backward(b["ids"][:24], [24], loss="sft")
        assert e.value.code() in (SC.UNAVAILABLE, SC.DEADLINE_EXCEEDED), e.value
        st = c0.get_status()
        assert st.dist.broken and st.step == 1
        assert st.memory.param_bytes == before.param_bytes
        with pytest.raises(EngineError) as e:
            c0.forward_backward(b["ids"][:24], [24], loss="sft")
        assert e.value.code() == SC.FAILED_PRECONDITION, e.value
    with EngineGroup([ds[0].addr, ds[2].addr], timeout=120) as g:
        g.initialize(dist_timeout_s=60, dist_zero_stage=3, replace=True, **INIT)
        g.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
        assert g.optimizer_step().step == 1


# Rank 1's broadcasts before it dies (ENGINED_TEST_DIST_EXIT_AT, a hook of
# dist_call_check): those of Initialize, a training step, a checkpoint and
# an export come first, so the 136th is one of layer 3's in the next
# ForwardBackward (the sequence is the same on every run; where a change
# moves it, the test says which part the death fell in).
DIES_AT_BROADCAST = 135


def test_rank_killed_inside_a_layer_gather(tmp_path):
    """Rank 1 dies (SIGKILL) as it enters a broadcast of the layer gathers
    of a ZeRO-3 ForwardBackward: rank 0, inside that gather, answers
    UNAVAILABLE naming the layer, keeps its slice (the step, Memory) and
    reports the group broken; a new group with a third daemon in rank 1's
    place loads the last checkpoint (saved before, on the shared root) and
    its exports are that checkpoint's parameters bit for bit."""
    store = make_tmp(prefix="engined-dist-")
    root = make_tmp(prefix="engined-ckpt-")
    args = ("--dist-store-root", store, "--checkpoint-root", root)
    ds = [Daemon(*args),
          Daemon(*args, env={"ENGINED_TEST_DIST_EXIT_AT": "broadcast:%d" % DIES_AT_BROADCAST}),
          Daemon(*args)]
    try:
        lens, b = step_batch(4)
        kw = dict(loss="sft", loss_mask=b["loss_mask"])
        with EngineGroup([d.addr for d in ds[:2]], timeout=120) as g:
            initialize_or_skip(g, dist_timeout_s=5, dist_zero_stage=3, **INIT)
            g.forward_backward(b["ids"], lens, **kw)
            g.optimizer_step()
            g.save_checkpoint("last", global_step=1)
            want = group_weights(g)[0]
            before = g.clients[0].get_status().memory
            with pytest.raises(GroupError) as e:
                g.forward_backward(b["ids"], lens, **kw)
            err0 = e.value.errors[0]
            assert err0.code() == SC.UNAVAILABLE, err0
            assert "gathering the weights of layer" in err0.details(), err0
            assert ds[1].proc.wait(timeout=60) == -signal.SIGKILL
            st = g.clients[0].get_status()
            assert st.dist.broken and st.step == 1
            assert st.memory.param_bytes == before.param_bytes
        with EngineGroup([ds[0].addr, ds[2].addr], timeout=120) as g:
            g.initialize(dist_timeout_s=60, dist_zero_stage=3, replace=True, **INIT)
            assert on_all(g, lambda c: c.load_checkpoint("last")) == [1, 1]
            for w in group_weights(g):
                assert all(np.array_equal(w[k], want[k]) for k in want)
            g.forward_backward(b["ids"], lens, **kw)
            assert g.optimizer_step().step == 2
    finally:
        codes = [d.stop() for d in ds]
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    assert codes[0] == 0 and codes[2] == 0, codes


@pytest.mark.parametrize("dist_daemons", [3], indirect=True)
def test_stage_3_loads_each_slice_from_the_model_directory(dist_daemons):
    """Initialize from a model directory with zero_stage 3: each rank reads
    its slice's ranges of the safetensors tensors, and the group's export
    is the directory's tensors bit for bit (a trained model, saved by a
    daemon alone and copied to each rank's model root)."""
    world = 3
    ref = dist_daemons[world]
    with EngineClient(ref.addr, timeout=300) as alone:
        alone.initialize(**INIT)
        lens, b = step_batch(6)
        alone.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
        alone.optimizer_step()
        alone.save_checkpoint("trained", contents=["model"])
        want = weights(alone.stream_weights())
    src = os.path.join(ref.ckpt_root, "trained")
    for d in dist_daemons[:world]:
        shutil.copytree(src, os.path.join(d.model_root, "trained"))
    with EngineGroup([d.addr for d in dist_daemons[:world]], timeout=300) as g:
        initialize_or_skip(g, dist_timeout_s=120, dist_zero_stage=3, model_path="trained",
                           seed=21, optimizer=INIT["optimizer"])
        for w in group_weights(g):
            assert all(np.array_equal(w[k], want[k]) for k in want)


def test_stopped_rank_times_out_a_sharded_call(three_daemons):
    """Rank 1 stopped (SIGSTOP: its sockets stay open, nothing answers):
    rank 0's ZeRO-3 ForwardBackward answers DEADLINE_EXCEEDED within the
    group's timeout, naming the collective, and the group is broken on
    rank 0; rank 1, continued, serves and is re-formed with rank 0."""
    ds = three_daemons
    lens, b = step_batch(5)
    with EngineGroup([d.addr for d in ds[:2]], timeout=120) as g:
        initialize_or_skip(g, dist_timeout_s=3, dist_zero_stage=3, **INIT)
        os.kill(ds[1].proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(EngineError) as e:
                g.clients[0].forward_backward(b["ids"][:24], [24], loss="sft")
            assert e.value.code() == SC.DEADLINE_EXCEEDED, e.value
            assert g.clients[0].get_status().dist.broken
        finally:
            os.kill(ds[1].proc.pid, signal.SIGCONT)
        g.initialize(dist_timeout_s=60, dist_zero_stage=3, replace=True, **INIT)
        g.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
        assert g.optimizer_step().step == 1


@pytest.mark.parametrize("dist_daemons", [2], indirect=True)
def test_ranks_making_different_kinds_of_call_are_refused(dist_daemons):
    """ZeRO-3: rank 0 forward-only while rank 1 trains: INVALID_ARGUMENT on
    both naming forward_only, nothing changed, and the group goes on."""
    with EngineGroup([d.addr for d in dist_daemons[:2]], timeout=300) as g:
        initialize_or_skip(g, dist_timeout_s=60, dist_zero_stage=3, **INIT)
        lens, b = step_batch(7)
        before = group_weights(g)[0]

        def call(c):
            try:
                c.forward_backward(b["ids"][:24], [24], loss="sft",
                                   forward_only=c is g.clients[0])
            except EngineError as e:
                return e
        errs = on_all(g, call)
        for e in errs:
            assert isinstance(e, EngineError) and e.code() == SC.INVALID_ARGUMENT, e
            assert "forward_only" in e.details(), e
        assert [s.accumulated_calls for s in g.get_status()] == [0, 0]
        assert all(np.array_equal(w, before[k]) for k, w in group_weights(g)[0].items())
        g.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
        assert g.optimizer_step().step == 1


@pytest.fixture
def share_daemons():
    """Two daemons on one Gloo store; rank 0 has a share socket, rank 1
    none (it only takes part in rank 0's shares)."""
    store = make_tmp(prefix="engined-dist-")
    sock = os.path.join(make_tmp(prefix="engined-share-"), "rank0.sock")
    ds = [Daemon("--dist-store-root", store, "--share-socket", sock),
          Daemon("--dist-store-root", store)]
    yield ds
    assert [d.stop() for d in ds] == [0, 0]


def bits(arrays):
    """name -> the raw bits of each array (bf16 as ml_dtypes or uint16)."""
    return {k: np.array(v).view(np.uint16 if np.array(v).itemsize == 2 else np.uint32)
            for k, v in arrays}


def timed_on_both(g, calls):
    """calls[r](clients[r]) on both ranks at once: each one's result or
    EngineError, and the seconds until both returned."""
    def one(rc):
        r, call = rc
        try:
            return call(g.clients[r])
        except EngineError as e:
            return e
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(2) as ex:
        out = list(ex.map(one, enumerate(calls)))
    return out, time.monotonic() - t0


def test_stage_3_exports_gather_each_tensor_with_the_other_ranks(share_daemons):
    """ZeRO-3 ShareWeights and GetPerTensorParam: rank 0 exports, rank 1
    makes the same request with gather_only (each tensor is gathered from
    both slices) and sends nothing. The share equals the stream bit for
    bit, in float32 and bfloat16, and so does AsyncEngineGroup's stream. A
    failure on one rank before the first gather (an unknown tensor name on
    rank 1; a share asked of rank 1, which has no share socket) is answered
    on both ranks at once, by the ranks' agreement, not after the group's
    timeout (120 s here), and the group trains on."""
    with EngineGroup([d.addr for d in share_daemons], timeout=300) as g:
        initialize_or_skip(g, dist_timeout_s=120, dist_zero_stage=3, **INIT)
        assert [s.dist.zero_stage for s in g.get_status()] == [3, 3]
        lens, b = step_batch(4)
        g.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
        g.optimizer_step()
        want = bits(g.stream_weights())
        with g.share_weights() as w:
            got = bits(w.items())
        assert list(got) == list(want)
        assert all(np.array_equal(got[k], want[k]) for k in want)
        want16 = bits(g.stream_weights(dtype="bfloat16"))
        with g.share_weights(dtype="bfloat16") as w:
            got16 = bits(w.items())
        assert all(np.array_equal(got16[k], want16[k]) for k in want16)
        # rank 0 stops reading after one tensor: the group finishes its
        # gathers and the next export is whole.
        next(iter(g.stream_weights()))
        assert all(np.array_equal(v, want[k]) for k, v in bits(g.stream_weights()).items())

        name = next(iter(want))
        out, dt = timed_on_both(g, [lambda c: dict(c.stream_weights(names=[name])),
                                    lambda c: c.gather_weights(names=["nope.weight"])])
        assert isinstance(out[1], EngineError) and out[1].code() == SC.NOT_FOUND, out[1]
        assert "nope.weight" in out[1].details()
        assert isinstance(out[0], EngineError) and out[0].code() == SC.NOT_FOUND, out[0]
        assert "rank 1" in out[0].details(), out[0]
        assert dt < 60, dt
        out, dt = timed_on_both(g, [lambda c: c.gather_weights(share=True),
                                    lambda c: c.share_weights()])
        assert isinstance(out[1], EngineError) and out[1].code() == SC.FAILED_PRECONDITION
        assert "share_socket" in out[1].details(), out[1]
        assert isinstance(out[0], EngineError) and "rank 1" in out[0].details(), out[0]
        assert dt < 60, dt
        assert [s.dist.broken for s in g.get_status()] == [False, False]

        g.forward_backward(b["ids"], lens, loss="sft", loss_mask=b["loss_mask"])
        assert g.optimizer_step().step == 2
        want = bits(g.stream_weights())

    async def async_stream():
        async with AsyncEngineGroup([d.addr for d in share_daemons], timeout=300) as ag:
            ag.zero_stage = 3   # the group the daemons formed above
            return bits([kv async for kv in ag.stream_weights()])
    got = asyncio.run(async_stream())
    assert all(np.array_equal(got[k], want[k]) for k in want)
