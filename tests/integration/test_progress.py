"""Progress of long jobs (issue 16 item 6): GetStatus.progress read while
the test hook holds a job at a safe point (daemon/test_hold.h; never
sized to the machine's speed), the `[log] slow_job_s` line, the Python
client's progress= callback and enginectl's plain progress lines.

Run: ENGINED_BIN=... ENGINECTL_BIN=... /usr/bin/python3 -m pytest
tests/integration/test_progress.py [-k name]
"""
import json
import os
import subprocess
import threading

import numpy as np
import pytest

from daemon_fixture import Daemon, wait_for
from engined_client import EngineClient, pb

CTL = os.environ.get("ENGINECTL_BIN", "build/client/enginectl")


def raw(c, method, resp):
    return c.channel.unary_unary("/engined.v1.TrainingEngine/" + method,
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=resp.FromString)


def held_progress(d, c, marks):
    """The running job's progress once it waits at a safe point (the hook
    logs a line for each hold: `marks` of them were there before)."""
    wait_for(lambda: d.safe_points_held() > marks, "a held safe point")
    s = c.get_status()
    assert s.busy and s.progress is not None, s
    return s.current_job, s.progress


@pytest.fixture
def held():
    d = Daemon(safe_points=True)
    c = EngineClient(d.addr, timeout=120)
    try:
        yield d, c
    finally:
        if os.path.exists(d.safe_point_file):
            d.release_safe_points()
        c.close()
        assert d.stop() == 0


def test_idle_status_has_no_progress(held):
    d, c = held
    s = c.get_status()
    assert not s.busy and s.progress is None, s


def test_initialize_counts_tensors(held):
    """Held before its 4th tensor: 3 of the model's tensors built."""
    d, c = held
    d.hold_safe_points(after=3)
    fut = raw(c, "Initialize", pb.InitializeResponse).future(
        pb.InitializeRequest(preset="tiny", seed=1), timeout=120)
    job, p = held_progress(d, c, 0)
    d.release_safe_points()
    r = fut.result()
    assert job == "Initialize"
    assert (p.phase, p.done, p.total, p.unit) == ("build", 3, r.num_tensors, "tensors"), p
    assert p.elapsed_s > 0


def test_forward_backward_counts_micro_batches(held):
    d, c = held
    c.initialize(preset="tiny", seed=1)
    ids = (np.arange(96, dtype=np.int32) * 13) % 1024
    req = pb.ForwardBackwardRequest(
        input_ids=pb.Tensor(dtype=pb.INT32, shape=[96], data=ids.tobytes()),
        seq_lens=[48, 48], loss=pb.LossSpec(name="sft"), max_tokens_per_micro_batch=48)
    d.hold_safe_points()
    fut = raw(c, "ForwardBackward", pb.ForwardBackwardResponse).future(req, timeout=120)
    job, p = held_progress(d, c, 0)
    d.release_safe_points()
    assert fut.result().num_micro_batches == 2
    assert job == "ForwardBackward"
    assert (p.phase, p.done, p.total, p.unit) == ("forward_backward", 1, 2, "micro-batches"), p


def verified_bytes(d, path):
    """The bytes a load checksums first: every file engine_state.json lists."""
    with open(os.path.join(d.ckpt_root, path, "engine_state.json")) as f:
        return sum(v["bytes"] for v in json.load(f)["files"].values())


def test_save_and_load_count_tensor_bytes(held):
    """A save held after its model file has written the model's bytes of
    the three families' (weights, two AdamW moments); held after both
    files, all of them. A load held at its safe point has verified the
    checksums (every listed file's bytes) and read no tensor yet."""
    d, c = held
    c.initialize(preset="tiny", seed=1)
    fam = c.get_status().num_parameters * 4
    save = raw(c, "SaveCheckpoint", pb.SaveCheckpointResponse)
    d.hold_safe_points()
    fut = save.future(pb.SaveCheckpointRequest(path="a"), timeout=120)
    job, p = held_progress(d, c, 0)
    d.release_safe_points()
    fut.result()
    assert job == "SaveCheckpoint"
    assert (p.phase, p.done, p.total, p.unit) == ("model.safetensors", fam, 3 * fam, "bytes"), p

    marks = d.safe_points_held()
    d.hold_safe_points(after=1)
    fut = save.future(pb.SaveCheckpointRequest(path="b"), timeout=120)
    _, p = held_progress(d, c, marks)
    d.release_safe_points()
    fut.result()
    assert (p.phase, p.done, p.total) == ("optimizer.safetensors", 3 * fam, 3 * fam), p

    marks = d.safe_points_held()
    d.hold_safe_points()
    fut = raw(c, "LoadCheckpoint", pb.LoadCheckpointResponse).future(
        pb.LoadCheckpointRequest(path="a", contents=["model"]), timeout=120)
    job, p = held_progress(d, c, marks)
    d.release_safe_points()
    fut.result()
    v = verified_bytes(d, "a")
    assert v > 3 * fam
    assert job == "LoadCheckpoint"
    assert (p.phase, p.done, p.total, p.unit) == ("verify", v, v + fam, "bytes"), p


def test_weight_stream_counts_bytes_sent(held):
    d, c = held
    c.initialize(preset="tiny", seed=1)
    total = c.get_status().num_parameters * 4
    d.hold_safe_points(after=1)     # held before the third message
    got = []
    t = threading.Thread(target=lambda: got.extend(
        c.stream_weights(bucket_bytes=4096)))
    t.start()
    job, p = held_progress(d, c, 0)
    d.release_safe_points()
    t.join(120)
    assert got and job == "GetPerTensorParam"
    assert (p.phase, p.done, p.total, p.unit) == ("send", 2 * 4096, total, "bytes"), p


def check_reports(calls, total):
    dones = [x[0] for x in calls]
    assert dones == sorted(dones) and dones[-1] == total, calls
    assert all(x[1] == total for x in calls), calls


@pytest.mark.parametrize("what", ["save", "load", "stream"])
def test_python_progress_callback(held, what):
    """progress= gets done values that never decrease and end at total,
    with the held point among them (a callable and a tqdm-like object)."""
    d, c = held
    c.initialize(preset="tiny", seed=1)
    fam = c.get_status().num_parameters * 4
    if what == "load":
        c.save_checkpoint("ck")
    calls = []

    class Bar:      # what a tqdm bar offers
        total = None
        n = 0

        def update(self, k):
            self.n += k
    bar = Bar()

    def cb(done, total, phase):
        calls.append((done, total, phase))
    run = {"save": lambda: c.save_checkpoint("ck2", progress=cb),
           "load": lambda: c.load_checkpoint("ck", progress=cb),
           "stream": lambda: list(c.stream_weights(bucket_bytes=4096, progress=cb))}[what]
    v = verified_bytes(d, "ck") if what == "load" else 0
    held_at = {"save": fam, "load": v, "stream": 2 * 4096}[what]
    d.hold_safe_points(after=1 if what == "stream" else 0)
    t = threading.Thread(target=run)
    t.start()
    held_progress(d, c, 0)
    # The client's own poll reports the held point (a bound for a hung poll).
    wait_for(lambda: held_at in [x[0] for x in calls], "the held point's report")
    d.release_safe_points()
    t.join(120)
    assert not t.is_alive()
    total = {"save": 3 * fam, "load": v + 3 * fam, "stream": fam}[what]
    check_reports(calls, total)

    # The same call with an object that has update(n).
    run2 = {"save": lambda: c.save_checkpoint("ck3", progress=bar),
            "load": lambda: c.load_checkpoint("ck", progress=bar),
            "stream": lambda: list(c.stream_weights(bucket_bytes=4096, progress=bar))}[what]
    marks = d.safe_points_held()
    d.hold_safe_points(after=1 if what == "stream" else 0)
    t = threading.Thread(target=run2)
    t.start()
    held_progress(d, c, marks)
    wait_for(lambda: bar.total is not None and bar.n == held_at, "the bar at the held point")
    d.release_safe_points()
    t.join(120)
    assert (bar.n, bar.total) == (total, total), (bar.n, bar.total)


def test_initialize_progress_callback_ends_at_the_tensor_count(held):
    d, c = held
    calls = []
    d.hold_safe_points(after=2)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", c.initialize(
        preset="tiny", progress=lambda *a: calls.append(a))))
    t.start()
    held_progress(d, c, 0)
    wait_for(lambda: any(x[0] == 2 for x in calls), "the held point's report")
    d.release_safe_points()
    t.join(120)
    n = out["r"].num_tensors
    check_reports(calls, n)
    assert (2, n, "build") in calls, calls


def test_slow_job_log_line():
    """A job held past [log] slow_job_s gets an INFO line naming its phase
    and counts, while it is still held."""
    d = Daemon("-o", "log.slow_job_s=0.05", safe_points=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        c.initialize(preset="tiny", seed=1)
        fam = c.get_status().num_parameters * 4
        d.hold_safe_points()
        fut = raw(c, "SaveCheckpoint", pb.SaveCheckpointResponse).future(
            pb.SaveCheckpointRequest(path="a"), timeout=120)
        line = "job SaveCheckpoint running for "
        want = ": model.safetensors, %d/%d bytes" % (fam, 3 * fam)
        wait_for(lambda: any(line in x and x.endswith(want)
                             for x in d.log_text().splitlines()), "the slow-job line")
        assert c.get_status().busy
        d.release_safe_points()
        fut.result()
        c.close()
    finally:
        assert d.stop() == 0


def test_slow_job_log_line_off():
    d = Daemon("-o", "log.slow_job_s=0", hold=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        d.hold()
        fut = raw(c, "Initialize", pb.InitializeResponse).future(
            pb.InitializeRequest(preset="tiny"), timeout=120)
        wait_for(lambda: "Initialize held" in d.log_text(), "the held Initialize")
        s = c.get_status()
        # Held before it ran: busy, no progress reported yet.
        assert s.busy and (s.progress.phase, s.progress.total) == ("", 0), s
        d.release()
        fut.result()
        assert "running for" not in d.log_text()
        c.close()
    finally:
        assert d.stop() == 0


def test_enginectl_plain_progress_lines(held):
    """Without a terminal: plain lines on stderr, the held point among them,
    the last one at done = total; --no-progress prints none."""
    d, c = held
    c.initialize(preset="tiny", seed=1)
    fam = c.get_status().num_parameters * 4
    err_path = os.path.join(d.tmp, "ctl.err")
    d.hold_safe_points()
    with open(err_path, "w") as err:
        p = subprocess.Popen([CTL, "--addr", d.addr, "save", "ck"], stdout=subprocess.PIPE,
                             stderr=err, text=True)
    held_line = "save: model.safetensors %d/%d bytes (33.3%%)" % (fam, 3 * fam)
    wait_for(lambda: held_line in open(err_path).read(), "enginectl's progress line")
    d.release_safe_points()
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0 and out.startswith("saved ck"), out
    lines = open(err_path).read().splitlines()
    assert all(x.startswith("save: ") for x in lines), lines
    assert "%d/%d bytes (100.0%%)" % (3 * fam, 3 * fam) in lines[-1], lines

    d.hold_safe_points()
    p = subprocess.Popen([CTL, "--addr", d.addr, "--no-progress", "save", "ck2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: d.safe_points_held() >= 2, "the second save held")
    # Held for longer than enginectl's first-second quiet time.
    wait_for(lambda: c.get_status().progress.elapsed_s > 1.5, "1.5 s of the held save")
    d.release_safe_points()
    out, errs = p.communicate(timeout=120)
    assert p.returncode == 0 and errs == "", errs


def test_async_client_progress(held):
    """AsyncEngineClient: the same progress= (a task of the loop polls)."""
    import asyncio
    from engined_client import AsyncEngineClient
    d, c = held
    c.initialize(preset="tiny", seed=1)
    fam = c.get_status().num_parameters * 4
    calls = []

    async def main():
        async with AsyncEngineClient(d.addr, timeout=120) as ac:
            save = asyncio.ensure_future(ac.save_checkpoint(
                "ck", progress=lambda *a: calls.append(a)))
            while not any(x[0] == fam for x in calls):
                assert not save.done()
                await asyncio.sleep(0.01)
            d.release_safe_points()
            await save
            got = [x async for x in ac.stream_weights(progress=lambda *a: calls.append(a))]
            assert got
    d.hold_safe_points()
    asyncio.run(asyncio.wait_for(main(), 120))
    save_calls = [x for x in calls if x[1] == 3 * fam]
    check_reports(save_calls, 3 * fam)
