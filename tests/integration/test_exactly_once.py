"""Exactly-once calls (issue 12): a request id (`engined-request-id`
metadata) makes a retried state-changing call return the first call's
outcome instead of running again. Jobs are held with the test hook
(ENGINED_TEST_HOLD_FILE), never sized to the machine's speed.

Run: ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_exactly_once.py [-k name]
"""
import threading

import grpc
import numpy as np
import pytest

from daemon_fixture import Daemon, wait_for

from engined_client import EngineClient, EngineError, pb

SC = grpc.StatusCode


def batch():
    ids = (np.arange(96, dtype=np.int32) * 13) % 1024
    return ids, [48, 48]


@pytest.fixture
def held():
    d = Daemon(hold=True)
    c = EngineClient(d.addr, timeout=120)
    c.initialize(replace=True, preset="tiny", seed=11, optimizer={"lr": 1e-3})
    try:
        yield d, c
    finally:
        c.close()
        assert d.stop() == 0


def single_step_norm(c):
    """The gradient norm of one ForwardBackward of batch() from the seed."""
    c.initialize(replace=True, preset="tiny", seed=11, optimizer={"lr": 1e-3})
    c.forward_backward(*batch(), loss="sft")
    return c.optimizer_step().grad_norm


def in_thread(fn, *args, **kw):
    out = {}

    def run():
        try:
            out["r"] = fn(*args, **kw)
        except EngineError as e:
            out["e"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_retry_after_client_deadline_applies_once(held):
    """The client's deadline passes while its ForwardBackward is running
    (held); the daemon finishes it. The retry with the same id returns that
    result: the gradients count once (grad_norm as after one call)."""
    d, c = held
    d.hold()
    t, out = in_thread(c.forward_backward, *batch(), loss="sft", timeout=0.5,
                       request_id="fb-1")
    t.join()
    assert out["e"].code() == SC.DEADLINE_EXCEEDED, out
    assert c.get_status().busy  # still running on the daemon
    d.release()
    r = c.forward_backward(*batch(), loss="sft", request_id="fb-1")
    s = c.get_status()
    assert (s.accumulated_calls, s.last_request_id) == (1, "fb-1"), s
    norm = c.optimizer_step().grad_norm
    assert norm == single_step_norm(c), norm
    assert r["loss"] > 0


def test_duplicate_waits_for_the_original(held):
    """A duplicate that arrives while the original runs waits for it and
    gets the same reply; the call runs once."""
    d, c = held
    d.hold()
    t1, o1 = in_thread(c.forward_backward, *batch(), loss="sft", return_log_probs=True,
                       request_id="dup")
    wait_for(lambda: c.get_status().busy, "the original to start")
    t2, o2 = in_thread(c.forward_backward, *batch(), loss="sft", return_log_probs=True,
                       request_id="dup")
    d.release()
    t1.join()
    t2.join()
    assert o1["r"]["loss"] == o2["r"]["loss"]
    assert np.array_equal(o1["r"]["log_probs"], o2["r"]["log_probs"])
    assert c.get_status().accumulated_calls == 1
    assert "rpc ForwardBackward" in d.log_text()


def test_recorded_outcomes_errors_and_reuse(held):
    """A recorded outcome is replayed at once, errors included; an id
    reused for another request is refused; a malformed id is refused."""
    d, c = held
    r1 = c.optimizer_step(request_id="step-a")
    r2 = c.optimizer_step(request_id="step-a")
    assert r1 == r2 and c.get_status().step == 1
    # The error of a call that ran is part of its outcome: a load of an
    # empty directory fails when it runs; once a checkpoint is saved there,
    # the same id still answers the recorded failure (it does not run).
    import os
    os.makedirs(os.path.join(d.ckpt_root, "later"))
    req = pb.LoadCheckpointRequest(path="later")
    with pytest.raises(EngineError) as e1:
        c._call("LoadCheckpoint", req, pb.LoadCheckpointResponse, request_id="load-a")
    first = (e1.value.code(), e1.value.details())
    assert first[0] != SC.OK
    c.save_checkpoint("later")
    with pytest.raises(EngineError) as e1:
        c._call("LoadCheckpoint", req, pb.LoadCheckpointResponse, request_id="load-a")
    assert (e1.value.code(), e1.value.details()) == first
    # A refusal before running (validation) records nothing: the retry runs.
    req2 = pb.LoadCheckpointRequest(path="not-yet")
    with pytest.raises(EngineError) as e1:
        c._call("LoadCheckpoint", req2, pb.LoadCheckpointResponse, request_id="load-b")
    assert e1.value.code() == SC.NOT_FOUND
    c.save_checkpoint("not-yet")
    c._call("LoadCheckpoint", req2, pb.LoadCheckpointResponse, request_id="load-b")
    try:
        c.save_checkpoint("run/a", request_id="save-a")
        c.save_checkpoint("run/b", request_id="save-a")
    except EngineError as e:
        assert e.code() == SC.INVALID_ARGUMENT and "was used for another request" in e.details()
    else:
        raise AssertionError("an id reused for another request was accepted")
    with pytest.raises(EngineError) as e2:
        c.optimizer_step(request_id="has space")
    assert e2.value.code() == SC.INVALID_ARGUMENT and "engined-request-id" in e2.value.details()
    assert c.get_status().step == 1


def test_call_refused_in_the_queue_runs_on_retry(held):
    """An OptimizerStep whose deadline passes while it waits behind a held
    job never runs and leaves no outcome: its retry with the same id runs."""
    d, c = held
    d.hold()
    t1, o1 = in_thread(c.forward_backward, *batch(), loss="sft")
    wait_for(lambda: c.get_status().busy, "the first job to start")
    t2, o2 = in_thread(c.optimizer_step, timeout=0.3, request_id="late-step")
    t2.join()
    assert o2["e"].code() == SC.DEADLINE_EXCEEDED
    d.release()
    t1.join()
    assert c.get_status().step == 0
    r = c.optimizer_step(request_id="late-step")
    assert r.step == 1 and r.grad_norm > 0
    assert c.optimizer_step(request_id="late-step").step == 1  # now recorded


def test_evicted_reply_answers_already_applied():
    """With no bytes kept for replays, a repeat of an applied id is
    ALREADY_EXISTS (applied, reply gone) and still does not run again."""
    d = Daemon("-o", "server.replay_bytes=0")
    try:
        c = EngineClient(d.addr, timeout=60)
        c.initialize(replace=True, preset="tiny")
        c.forward_backward(*batch(), loss="sft", request_id="x")
        with pytest.raises(EngineError) as e:
            c.forward_backward(*batch(), loss="sft", request_id="x")
        assert e.value.code() == SC.ALREADY_EXISTS and "already applied" in e.value.details()
        assert c.get_status().accumulated_calls == 1
        c.close()
    finally:
        assert d.stop() == 0


def two_micro_batches(c):
    """A training ForwardBackward request of 2 micro-batches and its call."""
    ids, lens = batch()
    req = pb.ForwardBackwardRequest(
        input_ids=pb.Tensor(dtype=pb.INT32, shape=[ids.size], data=ids.tobytes()),
        seq_lens=lens, loss=pb.LossSpec(name="sft"), max_tokens_per_micro_batch=48)
    call = c.channel.unary_unary("/engined.v1.TrainingEngine/ForwardBackward",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.ForwardBackwardResponse.FromString)
    return req, call


def cancel_midway(d, c, request_id):
    """A training ForwardBackward of 2 micro-batches, cancelled by its client
    while it waits at the safe point after the first one."""
    req, call = two_micro_batches(c)
    marks = d.safe_points_held()
    d.hold_safe_points()
    fut = call.future(req, timeout=120, metadata=[("engined-request-id", request_id)])
    wait_for(lambda: d.safe_points_held() > marks, "the first safe point")
    fut.cancel()  # the safe point lets the job go once the daemon sees this
    wait_for(lambda: not c.get_status().busy, "the call to stop")
    d.release_safe_points()
    assert "cancelled after 1 of 2 micro-batches" in d.log_text()


def test_cancelled_forward_backward_leaves_gradients_as_before():
    """Cancelled part-way, a ForwardBackward leaves the gradients exactly
    as before it: zero when it was the first since the step (no copy
    needed), or those of the earlier calls (restored from a copy)."""
    d = Daemon(safe_points=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        c.initialize(replace=True, preset="tiny", seed=11, optimizer={"lr": 1e-3})
        cancel_midway(d, c, "cancel-1")
        s = c.get_status()
        assert (s.accumulated_calls, s.accumulated_tokens) == (0, 0), s
        assert c.optimizer_step().grad_norm == 0.0
        # Onto an earlier call's gradients: the norm is that call's alone.
        c.initialize(replace=True, preset="tiny", seed=11, optimizer={"lr": 1e-3})
        c.forward_backward(*batch(), loss="sft")
        cancel_midway(d, c, "cancel-2")
        assert c.get_status().accumulated_calls == 1
        norm = c.optimizer_step().grad_norm
        assert norm == single_step_norm(c), norm
        # The cancelled call changed nothing, so its id keeps no outcome:
        # the retry under the same id runs (once), as idempotency keys do.
        req, call = two_micro_batches(c)
        first = call(req, timeout=60, metadata=[("engined-request-id", "cancel-2")])
        assert c.get_status().accumulated_calls == 1
        again = call(req, timeout=60, metadata=[("engined-request-id", "cancel-2")])
        assert again == first and c.get_status().accumulated_calls == 1
        c.close()
    finally:
        assert d.stop() == 0


def test_cancelled_save_leaves_the_previous_checkpoint():
    """A SaveCheckpoint cancelled at a safe point (after its model file)
    leaves the previous checkpoint and `latest` as they were and no partial
    directory; the next save works."""
    import os
    d = Daemon(safe_points=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        c.initialize(replace=True, preset="tiny", seed=3)
        c.save_checkpoint("run/step-1", global_step=1)
        run = os.path.join(d.ckpt_root, "run")
        before = sorted(os.listdir(run))
        latest = open(os.path.join(run, "latest")).read()
        call = c.channel.unary_unary("/engined.v1.TrainingEngine/SaveCheckpoint",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=pb.SaveCheckpointResponse.FromString)
        save2 = pb.SaveCheckpointRequest(path="run/step-2", global_step=2)
        d.hold_safe_points()
        fut = call.future(save2, timeout=120, metadata=[("engined-request-id", "save-2")])
        wait_for(lambda: d.safe_points_held() > 0, "the save's first safe point")
        fut.cancel()
        wait_for(lambda: not c.get_status().busy, "the save to stop")
        d.release_safe_points()
        assert "SaveCheckpoint: cancelled after writing model.safetensors" in d.log_text()
        assert sorted(os.listdir(run)) == before, os.listdir(run)
        assert open(os.path.join(run, "latest")).read() == latest
        assert c.load_checkpoint("run/step-1") == 1
        # Nothing was saved, so nothing is remembered: the client's retry
        # under the same id saves (the SaveCheckpoint that answered
        # CANCELLED to every retry).
        r = call(save2, timeout=120, metadata=[("engined-request-id", "save-2")])
        assert r.path == "run/step-2" and c.load_checkpoint("run/step-2") == 2
        assert call(save2, timeout=120, metadata=[("engined-request-id", "save-2")]) == r
        c.close()
    finally:
        assert d.stop() == 0


def test_cancelled_load_changes_nothing():
    """A LoadCheckpoint cancelled at its safe point (checked, nothing
    changed) leaves weights and step as they were."""
    d = Daemon(safe_points=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        c.initialize(replace=True, preset="tiny", seed=3)
        c.save_checkpoint("ck", global_step=7)
        c.forward_backward(*batch(), loss="sft")
        c.optimizer_step()
        w = {k: v.copy() for k, v in c.stream_weights()}
        call = c.channel.unary_unary("/engined.v1.TrainingEngine/LoadCheckpoint",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=pb.LoadCheckpointResponse.FromString)
        d.hold_safe_points()
        fut = call.future(pb.LoadCheckpointRequest(path="ck"), timeout=120)
        wait_for(lambda: d.safe_points_held() > 0, "the load's safe point")
        fut.cancel()
        wait_for(lambda: not c.get_status().busy, "the load to stop")
        d.release_safe_points()
        assert "LoadCheckpoint: cancelled before it changed anything" in d.log_text()
        assert c.get_status().step == 1
        assert all(np.array_equal(w[k], v) for k, v in c.stream_weights())
        assert c.load_checkpoint("ck") == 7 and c.get_status().step == 0
        c.close()
    finally:
        assert d.stop() == 0
