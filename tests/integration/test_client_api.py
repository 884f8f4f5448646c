"""The Python client without a daemon: typed results against engine.proto,
both clients' method sets, request ids and retries through fake channels
(deterministic: scripted failures, no timing), weight reassembly, bf16 and
torch conversions. Run with Debian's python (source tree) and with the PyPI
venv (the installed package), like test_daemon.py:
PYTHONPATH=client/python:build/client/python /usr/bin/python3 -m pytest
tests/integration/test_client_api.py
"""
import asyncio
import dataclasses
import inspect
import os
import platform
import re
import subprocess
import sys

import grpc
import numpy as np
import pytest

import engined_client
from bf16_ref import rne_bits
from sample_server import HANG as HANG_SERVER, SampleServer
from engined_client import (AsyncEngineClient, EngineClient, EngineError, ForwardBackwardResult,
                            LoadResult, LrResult, Mode, StepResult, pb, results, tensors)
from engined_client import _api, _rpc, aio, client as client_mod

SC = grpc.StatusCode
HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, "..", "..", "proto", "engined", "v1", "engine.proto")


def snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# --- typed results against the contract ---------------------------------------

def test_every_reply_field_is_in_its_result():
    for cls, msg in results.REPLY_TYPES.items():
        proto_fields = [f.name for f in msg.DESCRIPTOR.fields]
        if dataclasses.is_dataclass(cls):
            assert sorted(f.name for f in dataclasses.fields(cls)) == sorted(proto_fields), cls
        else:  # LrResult / LoadResult: a number standing for the one field
            assert len(proto_fields) == 1 and hasattr(cls(0), proto_fields[0]), cls


def test_results_from_replies():
    st = pb.GetStatusResponse(engine_key="k", mode=pb.MODE_TRAIN, step=3, lr=0.5, busy=True,
                              queued_jobs=2, accumulated_calls=4, last_request_id="id-1",
                              placement=pb.Placement(model=True, grad=True),
                              memory=pb.Memory(device_bytes=7, host_bytes=8, rss_bytes=9,
                                               activation_bytes=10, param_bytes=11,
                                               grad_bytes=12, optimizer_bytes=13,
                                               gathered_bytes=14))
    s = results.Status.from_proto(st)
    assert (s.engine_key, s.step, s.lr, s.busy, s.queued_jobs, s.accumulated_calls,
            s.last_request_id) == ("k", 3, 0.5, True, 2, 4, "id-1")
    assert s.mode == pb.MODE_TRAIN and s.mode is Mode.TRAIN
    assert s.placement == results.Placement(model=True, optimizer=False, grad=True)
    assert s.placement.optimizer is False
    assert s.memory == results.Memory(7, 8, 9, 10, 11, 12, 13, 14)
    assert s == results.Status.from_proto(st) and hash(s) == hash(results.Status.from_proto(st))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.step = 4
    # A mode this client does not know stays a number.
    assert results.Status.from_proto(pb.GetStatusResponse(mode=9)).mode == 9


def test_step_results_compare_by_value():
    a = StepResult.from_proto(pb.OptimizerStepResponse(grad_norm=1.5, lr=1e-3, step=2))
    b = StepResult.from_proto(pb.OptimizerStepResponse(grad_norm=1.5, lr=1e-3, step=2))
    c = StepResult.from_proto(pb.OptimizerStepResponse(grad_norm=1.5, lr=1e-3, step=3))
    assert a == b and a != c and (a.grad_norm, a.skipped, a.lr, a.step) == (1.5, False, 1e-3, 2)


def test_lr_and_load_results_are_numbers():
    lr = LrResult.from_proto(pb.LrSchedulerStepResponse(lr=0.25))
    assert lr == 0.25 and lr.lr == 0.25 and isinstance(lr, float) and lr > 0
    g = LoadResult.from_proto(pb.LoadCheckpointResponse(global_step=7))
    assert g == 7 and g.global_step == 7 and isinstance(g, int)
    assert repr(g) == "LoadResult(global_step=7)"


def test_forward_backward_result_is_a_mapping():
    m = pb.ForwardBackwardResponse(loss=2.5, metrics={"num_tokens": 10.0}, num_micro_batches=2)
    m.log_probs.CopyFrom(engined_client.tensor(np.array([0.0, -1.5, -2.0], np.float32)))
    r = ForwardBackwardResult.from_proto(m)
    assert r.loss == r["loss"] == 2.5 and r["metrics"]["num_tokens"] == 10.0
    assert r.num_micro_batches == 2 and r.entropy is None and r["values"] is None
    assert r.log_probs.dtype == np.float32 and list(r["log_probs"]) == [0.0, -1.5, -2.0]
    assert set(r) == {"loss", "metrics", "num_micro_batches", "log_probs", "entropy", "values"}
    assert "loss" in r and "nope" not in r and r.get("nope") is None
    with pytest.raises(KeyError):
        r["nope"]
    # Equality: arrays by value (as the dict it replaced, compared key by key).
    again = ForwardBackwardResult.from_proto(pb.ForwardBackwardResponse.FromString(
        m.SerializeToString()))
    assert r == again and not (r != again) and r == dict(r)
    other = dict(r, log_probs=np.array([0.0, -1.5, -2.5], np.float32))
    assert r != other and r != dict(r, loss=2.0)
    assert r != dict(r, log_probs=None)
    with pytest.raises(TypeError):
        hash(r)
    assert "shape=(3,)" in repr(r)


def completion_msg(p, k, toks, top_k=0, prompt=0, reason=pb.FINISH_REASON_LENGTH):
    n = len(toks)
    return pb.Completion(
        prompt_index=p, sample_index=k, token_ids=toks,
        logprobs=[-0.5 * (i + 1) for i in range(n)], finish_reason=reason,
        top_token_ids=[t + j for t in toks for j in range(top_k)],
        top_logprobs=[-0.25 * j for _ in toks for j in range(top_k)],
        prompt_logprobs=[0.0] + [-1.0] * (prompt - 1) if prompt else [])


def test_sample_results_from_replies():
    reps = [pb.SampleResponse(completions=[completion_msg(1, 0, [7, 8], top_k=2, prompt=3)],
                              weights_version=4),
            pb.SampleResponse(completions=[completion_msg(0, 1, [5], reason=pb.FINISH_REASON_STOP),
                                           completion_msg(0, 0, [3, 4, 5])], weights_version=4)]
    r = results.SampleResult.from_replies(reps)
    assert r.weights_version == 4
    assert [(c.prompt_index, c.sample_index) for c in r.completions] == [(0, 0), (0, 1), (1, 0)]
    a, b, c = r.completions
    assert a.token_ids == [3, 4, 5] and isinstance(a.token_ids, list)
    assert a.logprobs.dtype == np.float32 and np.array_equal(a.logprobs, [-0.5, -1.0, -1.5])
    assert a.finish_reason == "length" and b.finish_reason == "stop"
    assert a.top_token_ids is None and a.top_logprobs is None and a.prompt_logprobs is None
    assert c.top_token_ids.dtype == np.int32 and c.top_token_ids.shape == (2, 2)
    assert np.array_equal(c.top_token_ids, [[7, 8], [8, 9]])
    assert c.top_logprobs.dtype == np.float32 and np.array_equal(c.top_logprobs,
                                                                  [[0, -0.25], [0, -0.25]])
    assert c.prompt_logprobs.dtype == np.float32 and np.array_equal(c.prompt_logprobs,
                                                                     [0, -1, -1])
    # Compared by value (arrays by dtype, shape and values), frozen, unhashable.
    assert r == results.SampleResult.from_replies(reps)
    assert a != c and a == results.Completion.from_proto(completion_msg(0, 0, [3, 4, 5]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.token_ids = []
    with pytest.raises(TypeError):
        hash(a)
    # A reason this client does not know stays a number; no replies: nothing.
    assert results.Completion.from_proto(pb.Completion(finish_reason=7)).finish_reason == 7
    assert results.SampleResult.from_replies([]) == results.SampleResult([], 0)
    assert results.SampleResult.from_proto(reps[0]).completions == [r.completions[2]]
    # top_* not a whole number of entries per token: the reply is broken.
    bad = pb.Completion(token_ids=[1, 2], logprobs=[0, 0], top_token_ids=[1, 2, 3])
    with pytest.raises(EngineError) as e:
        results.Completion.from_proto(bad)
    assert e.value.code() == SC.DATA_LOSS and "top_token_ids" in e.value.details()


def test_sample_request():
    req = _api.sample_request(np.array([[1, 2], [3, 4]], np.int64), [3, 1], max_tokens=5)
    assert req.input_ids.dtype == pb.INT32 and list(req.input_ids.shape) == [4]
    assert np.frombuffer(req.input_ids.data, np.int32).tolist() == [1, 2, 3, 4]
    assert list(req.seq_lens) == [3, 1] and req.max_tokens == 5 and req.num_samples == 1
    # None: the oneofs unset (the daemon's defaults); 0 is a value.
    assert not req.HasField("temperature") and not req.HasField("top_p")
    req = _api.sample_request([1], [1], max_tokens=1, num_samples=3, temperature=0.0,
                              top_k=4, top_p=0.9, seed=2**64 - 1, stop_token_ids=np.array([2, 3]),
                              stop_sequences=[[5, 6], (7,)], top_logprobs=2,
                              prompt_logprobs=True, adapter="a",
                              max_tokens_per_micro_batch=64)
    assert req.HasField("temperature") and req.temperature == 0.0
    assert req.HasField("top_p") and abs(req.top_p - 0.9) < 1e-6
    assert (req.num_samples, req.top_k, req.seed, list(req.stop_token_ids)) == (
        3, 4, 2**64 - 1, [2, 3])
    assert [list(s.token_ids) for s in req.stop_sequences] == [[5, 6], [7]]
    assert (req.top_logprobs, req.prompt_logprobs, req.adapter,
            req.max_tokens_per_micro_batch) == (2, True, "a", 64)
    # Every field of SampleRequest is an argument of sample and sample_iter.
    args = set(inspect.signature(_api.sample_request).parameters)
    assert args == {f.name for f in pb.SampleRequest.DESCRIPTOR.fields}
    for fn in (EngineClient.sample, EngineClient.sample_iter):
        assert set(inspect.signature(fn).parameters) == args | {"self", "timeout"}, fn
    assert "kv_cache_bytes" in inspect.signature(EngineClient.initialize).parameters


# --- the two clients' methods ---------------------------------------------------

def test_both_clients_have_every_rpc():
    svc = pb.DESCRIPTOR.services_by_name["TrainingEngine"]
    names = {snake(m.name) for m in svc.methods}
    for cls in (EngineClient, AsyncEngineClient):
        for n in names:
            assert callable(getattr(cls, n, None)), (cls, n)
    assert "stream_weights" in dir(AsyncEngineClient)
    for n in _api.Api.RPC_METHODS:
        fn = getattr(AsyncEngineClient, n)
        assert inspect.iscoroutinefunction(fn), n
        assert inspect.signature(fn) == inspect.signature(getattr(EngineClient, n)), n
    assert inspect.isasyncgenfunction(AsyncEngineClient.stream_weights)
    assert (inspect.signature(AsyncEngineClient.stream_weights)
            == inspect.signature(EngineClient.stream_weights))
    assert (inspect.signature(AsyncEngineClient.sample_iter)
            == inspect.signature(EngineClient.sample_iter))
    assert "Sample" not in _rpc.STATE_CHANGING  # a read: no request id, no retry


def test_request_ids_are_defined_once():
    assert aio.Attempts is client_mod.Attempts is _rpc.Attempts
    assert client_mod._STATE_CHANGING is _rpc.STATE_CHANGING
    assert client_mod._RETRYABLE is _rpc.RETRYABLE
    assert engined_client.REQUEST_ID_KEY == client_mod.REQUEST_ID_KEY == "engined-request-id"
    # The state-changing methods are the ones engine.proto's header names.
    with open(PROTO) as f:
        text = " ".join(line.lstrip("/ ").strip() for line in f)
    listed = re.search(r"a state-changing call \(([^)]*)\)", text).group(1)
    assert set(re.findall(r"\w+", listed)) == set(_rpc.STATE_CHANGING)
    svc = {m.name for m in pb.DESCRIPTOR.services_by_name["TrainingEngine"].methods}
    assert _rpc.STATE_CHANGING <= svc


def test_backoff_doubles_and_stops():
    a = _rpc.Attempts("OptimizerStep", retries=3, backoff=0.2)
    err = FakeRpcError(SC.UNAVAILABLE)
    assert [a.retry_delay(err) for _ in range(4)] == [0.2, 0.4, 0.8, None]
    assert _rpc.Attempts("OptimizerStep", 3).retry_delay(FakeRpcError(SC.INTERNAL)) is None
    g = _rpc.Attempts("GetStatus", 3)
    assert g.metadata is None and g.retry_delay(err) is None


# --- retries through fake channels ------------------------------------------------

class FakeRpcError(grpc.RpcError):
    def __init__(self, code):
        super().__init__(code.name)
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "fake " + self._code.name


class FakeChannel:
    """A channel whose unary calls answer from a script (an exception to
    raise or a reply message per attempt, through the client's serializers)
    and record (method, request, metadata). aio=True: calls are awaited."""

    def __init__(self, script, aio=False):
        self.script = list(script)
        self.calls = []
        self.aio = aio

    def unary_unary(self, path, request_serializer=None, response_deserializer=None):
        def attempt(req, metadata):
            data = request_serializer(req) if request_serializer else req
            self.calls.append((path.rsplit("/", 1)[-1], data, dict(metadata or ())))
            out = self.script.pop(0)
            if isinstance(out, Exception):
                raise out
            raw = out.SerializeToString()
            return response_deserializer(raw) if response_deserializer else raw

        def call(req, timeout=None, metadata=None):
            if not self.aio:
                return attempt(req, metadata)

            async def run():
                await asyncio.sleep(0)
                return attempt(req, metadata)
            return run()
        return call

    def unary_stream(self, path, request_serializer=None, response_deserializer=None,
                     *_grpc_args, **_grpc_kwargs):
        """A call whose messages are the script's next entry (a list of
        reply messages; an exception in it ends the stream with that
        error; HANG waits until the call is cancelled). grpc's interceptor
        (the token) passes more arguments, which newer grpcio adds to."""
        def call(req, timeout=None, metadata=None, **_grpc_options):
            self.calls.append((path.rsplit("/", 1)[-1], request_serializer(req),
                               dict(metadata or ())))
            s = FakeStream(self.script.pop(0), response_deserializer, self.aio)
            self.streams.append(s)
            return s
        return call

    @property
    def streams(self):
        return self.__dict__.setdefault("_streams", [])

    def close(self):
        pass


HANG = object()


class FakeStream:
    """A server stream's call: iterable (sync) or async-iterable, .cancel()."""

    def __init__(self, items, deserialize, aio):
        self.items = list(items)
        self.deserialize = deserialize
        self.aio = aio
        self.cancelled = False
        self.sent = 0

    def cancel(self):
        self.cancelled = True
        return True

    def _next(self):
        out = self.items.pop(0)
        if isinstance(out, Exception):
            raise out
        self.sent += 1
        return self.deserialize(out.SerializeToString())

    def __iter__(self):
        while self.items and not self.cancelled:
            if self.items[0] is HANG:
                raise AssertionError("a sync stream cannot hang")
            yield self._next()

    async def _aiter(self):
        while self.items and not self.cancelled:
            if self.items[0] is HANG:
                while not self.cancelled:
                    await asyncio.sleep(0.01)
                raise asyncio.CancelledError()
            await asyncio.sleep(0)
            yield self._next()

    def __aiter__(self):
        return self._aiter()


def run_client(kind, script, fn, **kw):
    """fn(client) through the sync or the async client on a FakeChannel;
    returns (result or the EngineError raised, the channel)."""
    ch = FakeChannel(script, aio=(kind == "async"))
    kw.setdefault("retry_backoff", 0)
    if kind == "sync":
        c = EngineClient(channel=ch, **kw)
        try:
            return fn(c), ch
        except EngineError as e:
            return e, ch

    async def main():
        c = AsyncEngineClient(channel=ch, **kw)
        try:
            return await fn(c)
        except EngineError as e:
            return e
    return asyncio.run(main()), ch


STEP = pb.OptimizerStepResponse(grad_norm=0.5, lr=1e-3, step=1)
KINDS = ["sync", "async"]


@pytest.mark.parametrize("kind", KINDS)
def test_retry_sends_the_same_request_id(kind):
    r, ch = run_client(kind, [FakeRpcError(SC.UNAVAILABLE), FakeRpcError(SC.DEADLINE_EXCEEDED),
                              STEP], lambda c: c.optimizer_step(lr=1e-3), retries=2)
    assert r == StepResult(grad_norm=0.5, skipped=False, lr=1e-3, step=1), r
    ids = [md[engined_client.REQUEST_ID_KEY] for _, _, md in ch.calls]
    assert len(ids) == 3 and len(set(ids)) == 1 and re.fullmatch(r"[0-9a-f]{32}", ids[0])
    assert len({data for _, data, _ in ch.calls}) == 1  # the same request bytes too
    assert [m for m, _, _ in ch.calls] == ["OptimizerStep"] * 3


@pytest.mark.parametrize("kind", KINDS)
def test_retry_keeps_a_given_request_id(kind):
    fb = pb.ForwardBackwardResponse(loss=1.25, num_micro_batches=1)
    r, ch = run_client(kind, [FakeRpcError(SC.UNAVAILABLE), fb],
                       lambda c: c.forward_backward([1, 2, 3], [3], loss="sft",
                                                    request_id="fb-7"), retries=1)
    assert r["loss"] == 1.25 and r.loss == 1.25
    assert [md[engined_client.REQUEST_ID_KEY] for _, _, md in ch.calls] == ["fb-7", "fb-7"]


@pytest.mark.parametrize("kind", KINDS)
def test_no_retry_beyond_retries_or_for_other_codes(kind):
    e, ch = run_client(kind, [FakeRpcError(SC.UNAVAILABLE), FakeRpcError(SC.UNAVAILABLE)],
                       lambda c: c.zero_grad(), retries=1)
    assert isinstance(e, EngineError) and e.code() == SC.UNAVAILABLE and len(ch.calls) == 2
    e, ch = run_client(kind, [FakeRpcError(SC.INVALID_ARGUMENT)],
                       lambda c: c.save_checkpoint("x"), retries=3)
    assert e.code() == SC.INVALID_ARGUMENT and e.details() == "fake INVALID_ARGUMENT"
    assert len(ch.calls) == 1
    e, ch = run_client(kind, [FakeRpcError(SC.UNAVAILABLE)], lambda c: c.optimizer_step())
    assert e.code() == SC.UNAVAILABLE and len(ch.calls) == 1  # retries=0: the default


@pytest.mark.parametrize("kind", KINDS)
def test_reads_carry_no_id_and_are_not_retried(kind):
    e, ch = run_client(kind, [FakeRpcError(SC.UNAVAILABLE)], lambda c: c.get_status(),
                       retries=3)
    assert e.code() == SC.UNAVAILABLE and len(ch.calls) == 1
    assert engined_client.REQUEST_ID_KEY not in ch.calls[0][2]


@pytest.mark.parametrize("kind", KINDS)
def test_each_call_gets_its_own_id(kind):
    lr = pb.LrSchedulerStepResponse(lr=0.5)

    def two(c):
        if kind == "sync":
            return [c.lr_scheduler_step(), c.lr_scheduler_step()]

        async def both():
            return [await c.lr_scheduler_step(), await c.lr_scheduler_step()]
        return both()
    r, ch = run_client(kind, [lr, lr], two)
    assert r == [0.5, 0.5] and all(isinstance(x, LrResult) for x in r)
    ids = [md[engined_client.REQUEST_ID_KEY] for _, _, md in ch.calls]
    assert len(set(ids)) == 2


def test_async_client_sends_the_token():
    r, ch = run_client("async", [pb.GetStatusResponse(step=5)], lambda c: c.get_status(),
                       token="s3cret")
    assert r.step == 5 and ch.calls[0][2]["authorization"] == "Bearer s3cret"


# --- Sample: a server stream ------------------------------------------------------

SAMPLE_REPLIES = [
    pb.SampleResponse(completions=[completion_msg(1, 0, [9, 9])], weights_version=2),
    pb.SampleResponse(completions=[completion_msg(0, 1, [4]), completion_msg(0, 0, [5, 6])],
                      weights_version=2)]


@pytest.mark.parametrize("kind", KINDS)
def test_sample_reads_the_whole_stream(kind):
    r, ch = run_client(kind, [SAMPLE_REPLIES], lambda c: c.sample(
        [1, 2, 3, 4], [3, 1], max_tokens=2, num_samples=2, temperature=0.5, seed=3),
        retries=3, token="t")
    assert r == results.SampleResult.from_replies(SAMPLE_REPLIES) and r.weights_version == 2
    assert [(c.prompt_index, c.sample_index) for c in r.completions] == [(0, 0), (0, 1), (1, 0)]
    [(method, data, md)] = ch.calls
    assert method == "Sample" and engined_client.REQUEST_ID_KEY not in md
    assert md["authorization"] == "Bearer t"
    req = pb.SampleRequest.FromString(data)
    assert (list(req.seq_lens), req.max_tokens, req.num_samples, req.temperature,
            req.seed) == ([3, 1], 2, 2, 0.5, 3)
    # A stream that fails midway: its status, no retry (a read).
    e, ch = run_client(kind, [[SAMPLE_REPLIES[0], FakeRpcError(SC.RESOURCE_EXHAUSTED)]],
                       lambda c: c.sample([1], [1], max_tokens=1), retries=3)
    assert isinstance(e, EngineError) and e.code() == SC.RESOURCE_EXHAUSTED
    assert len(ch.calls) == 1


def test_sample_iter_yields_as_delivered():
    ch = FakeChannel([SAMPLE_REPLIES, SAMPLE_REPLIES, [FakeRpcError(SC.INVALID_ARGUMENT)]])
    c = EngineClient(channel=ch)
    gen = c.sample_iter([1, 2, 3, 4], [3, 1], max_tokens=2, num_samples=2)
    assert ch.calls == []            # the call starts at the first item
    got = list(gen)
    assert [(x.prompt_index, x.sample_index) for x in got] == [(1, 0), (0, 1), (0, 0)]
    assert all(isinstance(x, engined_client.Completion) for x in got)
    # Closed early: the call is cancelled, the rest never read.
    gen = c.sample_iter([1], [1], max_tokens=2)
    first = next(gen)
    assert first.token_ids == [9, 9] and not ch.streams[1].cancelled
    gen.close()
    assert ch.streams[1].cancelled and ch.streams[1].sent == 1
    with pytest.raises(EngineError) as e:
        next(c.sample_iter([1], [1], max_tokens=2))
    assert e.value.code() == SC.INVALID_ARGUMENT and ch.streams[2].cancelled
    # Bad arguments fail at the call, before any stream.
    with pytest.raises(TypeError):
        c.sample_iter([1], [1], max_tokens=1, stop_sequences=[5])
    assert len(ch.calls) == 3


def test_async_sample_iter_cancels():
    async def main():
        ch = FakeChannel([SAMPLE_REPLIES, [SAMPLE_REPLIES[0], HANG], [SAMPLE_REPLIES[0], HANG]],
                         aio=True)
        c = AsyncEngineClient(channel=ch, token="s")
        got = [x async for x in c.sample_iter([1, 2, 3, 4], [3, 1], max_tokens=2)]
        assert [(x.prompt_index, x.sample_index) for x in got] == [(1, 0), (0, 1), (0, 0)]
        assert ch.calls[0][2]["authorization"] == "Bearer s"
        # aclose() after the first item cancels the call.
        gen = c.sample_iter([1], [1], max_tokens=2)
        assert (await gen.__anext__()).token_ids == [9, 9]
        await gen.aclose()
        assert ch.streams[1].cancelled
        # So does cancelling the task waiting for the next item.
        gen = c.sample_iter([1], [1], max_tokens=2)
        await gen.__anext__()
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.05)
        assert not ch.streams[2].cancelled
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ch.streams[2].cancelled
    asyncio.run(main())


def test_sample_over_a_real_channel():
    """The same through grpcio's own calls, against a server of Sample alone:
    closing the iterator early cancels the call on the server too."""
    script = [SAMPLE_REPLIES, [SAMPLE_REPLIES[0], HANG_SERVER],
              [SAMPLE_REPLIES[0], (SC.FAILED_PRECONDITION, "no engine")],
              SAMPLE_REPLIES, [SAMPLE_REPLIES[0], HANG_SERVER]]
    with SampleServer(script) as srv:
        with EngineClient(srv.addr, timeout=30) as c:
            r = c.sample(np.arange(4), [3, 1], max_tokens=2, top_p=0.5, stop_sequences=[[1, 2]])
            assert r == results.SampleResult.from_replies(SAMPLE_REPLIES)
            req = srv.requests[0]
            assert req.HasField("top_p") and not req.HasField("temperature")
            assert [list(q.token_ids) for q in req.stop_sequences] == [[1, 2]]
            gen = c.sample_iter([1], [1], max_tokens=2)
            assert next(gen).token_ids == [9, 9]
            gen.close()
            assert srv.cancelled.wait(10)
            srv.cancelled.clear()
            with pytest.raises(EngineError) as e:
                list(c.sample_iter([1], [1], max_tokens=2))
            assert e.value.code() == SC.FAILED_PRECONDITION and e.value.details() == "no engine"

        async def main():
            async with AsyncEngineClient(srv.addr, timeout=30) as ac:
                r = await ac.sample([1, 2, 3, 4], [3, 1], max_tokens=2)
                assert r.completions == results.SampleResult.from_replies(
                    SAMPLE_REPLIES).completions
                gen = ac.sample_iter([1], [1], max_tokens=2)
                assert (await gen.__anext__()).token_ids == [9, 9]
                await gen.aclose()
            assert await asyncio.get_running_loop().run_in_executor(
                None, srv.cancelled.wait, 10)
        asyncio.run(main())


# --- weights ---------------------------------------------------------------------

def buckets_of(tensors_, bucket_bytes):
    """ParamBucket messages of (name, dtype, array) as the daemon cuts them."""
    out, cur, data = [], [], bytearray()
    for name, dt, a in tensors_:
        raw = a.tobytes()
        off = 0
        while off < len(raw):
            if len(data) == bucket_bytes:
                out.append(pb.ParamBucket(slices=cur, data=bytes(data)))
                cur, data = [], bytearray()
            n = min(len(raw) - off, bucket_bytes - len(data))
            cur.append(pb.TensorSlice(name=name, dtype=dt, shape=list(a.shape),
                                      tensor_bytes=len(raw), tensor_offset=off,
                                      data_offset=len(data), length=n))
            data += raw[off:off + n]
            off += n
    out.append(pb.ParamBucket(slices=cur, data=bytes(data), last=True))
    return out


# Run in a fresh interpreter: whether glibc maps a 1 MiB block on its own,
# and whether freeing 64 blocks of 64 KiB (a message's receive slices)
# shrinks the heap, before and after a client is made (_rpc.keep_heap_pages).
HEAP_PROBE = r"""
import ctypes, sys
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_ssize_t]
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
def big_block_mapped():
    before = libc.mallinfo2().hblks
    p = libc.malloc(1 << 20)
    during = libc.mallinfo2().hblks
    libc.free(p)
    return during > before
def message_shrinks_heap():
    ps = [libc.malloc(64 << 10) for _ in range(64)]
    for p in ps:
        ctypes.memset(p, 1, 64 << 10)
    end = libc.sbrk(0)
    for p in reversed(ps):
        libc.free(p)
    return libc.sbrk(0) < end
if sys.argv[1] == "client":
    import engined_client
    engined_client.EngineClient("127.0.0.1:1")  # no connection until a call
print(big_block_mapped(), message_shrinks_heap(), message_shrinks_heap())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's heap policy")
def test_client_keeps_heap_pages():
    def probe(arg):
        return subprocess.run([sys.executable, "-c", HEAP_PROBE, arg], check=True,
                              capture_output=True, text=True).stdout.split()
    assert probe("none") == ["True", "True", "True"]  # glibc's defaults
    assert probe("client") == ["False", "False", "False"]


def test_assembler_split_and_shared_buckets():
    rng = np.random.default_rng(0)
    ts = [("a", pb.FLOAT32, rng.standard_normal((3, 5)).astype(np.float32)),
          ("b", pb.FLOAT32, rng.standard_normal(2).astype(np.float32)),
          ("c", pb.FLOAT16, rng.standard_normal((4, 4)).astype(np.float16))]
    for bucket_bytes in (8, 24, 1 << 20):
        asm = tensors.Assembler()
        got = [x for b in buckets_of(ts, bucket_bytes) for x in asm.feed(b)]
        asm.finish()
        assert [n for n, _ in got] == ["a", "b", "c"]
        for (n, a), (_, _, ref) in zip(got, ts):
            assert a.dtype == ref.dtype and np.array_equal(a, ref) and a.flags.writeable
    # A stream that ends inside a tensor, or a slice of another tensor.
    asm = tensors.Assembler()
    asm.feed(buckets_of(ts, 8)[0])
    with pytest.raises(EngineError) as e:
        asm.finish()
    assert e.value.code() == SC.DATA_LOSS and "inside a" in e.value.details()
    bad = pb.ParamBucket(slices=[pb.TensorSlice(name="x", tensor_bytes=8, tensor_offset=4,
                                                length=4)], data=b"\0" * 4)
    with pytest.raises(EngineError):
        tensors.Assembler().feed(bad)


def test_parse_bucket_equals_protobufs_parse():
    """tensors.parse_bucket (stream_weights' deserializer: data viewed, not
    copied) reads what protobuf reads, from any valid encoding, and refuses
    what protobuf refuses."""
    rng = np.random.default_rng(1)
    ts = [("a", pb.FLOAT32, rng.standard_normal((3, 5)).astype(np.float32)),
          ("b", pb.FLOAT16, rng.standard_normal(7).astype(np.float16))]
    msgs = [m.SerializeToString() for m in buckets_of(ts, 24)]

    def field(num, wt, payload):
        key = bytes([num << 3 | wt])
        if wt == 2:
            return key + bytes([len(payload)]) + payload
        return key + payload
    # Fields in another order, an unknown field of each wire type, and a
    # repeated data field (the last counts).
    first = buckets_of(ts, 24)[0]
    slices = b"".join(field(1, 2, s.SerializeToString()) for s in first.slices)
    odd = (field(2, 2, b"stale") + field(9, 0, b"\x05") + field(3, 0, b"\x01") +
           field(10, 1, b"\0" * 8) + slices + field(11, 5, b"\0" * 4) +
           field(12, 2, b"xyz") + field(2, 2, first.data))
    msgs.append(odd)
    for raw in msgs:
        ref = pb.ParamBucket.FromString(raw)
        got = tensors.parse_bucket(raw)
        assert isinstance(got.data, memoryview) and got.data.obj is raw or len(got.data) == 0
        assert bytes(got.data) == ref.data and got.last == ref.last
        assert list(got.slices) == list(ref.slices)
    assert tensors.parse_bucket(odd).last is True
    # Truncated, overlong varints, a group: protobuf refuses them too.
    for bad in (odd[:-3], b"\x12\x7f", b"\x0a" + b"\xff" * 11, b"\x13"):
        with pytest.raises(Exception):
            pb.ParamBucket.FromString(bad)
        with pytest.raises(ValueError):
            tensors.parse_bucket(bad)
    # Whole tensors through it, as stream_weights assembles them.
    asm = tensors.Assembler()
    got = [x for raw in msgs[:-1] for x in asm.feed(tensors.parse_bucket(raw))]
    asm.finish()
    assert [n for n, _ in got] == ["a", "b"]
    assert all(np.array_equal(a, ref) for (_, a), (_, _, ref) in zip(got, ts))


def test_bf16_dtype():
    bits = rne_bits(np.array([1.0, -2.5, 3.14159, 1e-3], np.float32))
    asm = tensors.Assembler()
    [(name, a)] = asm.feed(pb.ParamBucket(slices=[pb.TensorSlice(
        name="w", dtype=pb.BFLOAT16, shape=[2, 2], tensor_bytes=8, length=8)],
        data=bits.tobytes(), last=True))
    assert a.shape == (2, 2) and np.array_equal(a.view(np.uint16).ravel(), bits)
    try:
        import ml_dtypes
    except ImportError:
        assert not engined_client.HAVE_ML_DTYPES and a.dtype == np.uint16
        return
    assert engined_client.HAVE_ML_DTYPES and a.dtype == ml_dtypes.bfloat16
    assert np.array_equal(a.astype(np.float32).ravel(),
                          (bits.astype(np.uint32) << 16).view(np.float32))
    # tensor() sends ml_dtypes arrays as BFLOAT16.
    t = engined_client.tensor(a)
    assert t.dtype == pb.BFLOAT16 and t.data == bits.tobytes()


def test_to_torch():
    torch = pytest.importorskip("torch")
    bits = rne_bits(np.array([1.0, -2.5, 3.14159, 65504.0], np.float32))
    t = engined_client.to_torch(bits, bfloat16=True)
    assert t.dtype == torch.bfloat16 and t.shape == (4,)
    assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), bits)
    assert t[0].item() == 1.0 and t[1].item() == -2.5
    f = engined_client.to_torch(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert f.dtype == torch.float32 and f.shape == (2, 3) and f[1, 2].item() == 5.0
    if engined_client.HAVE_ML_DTYPES:
        t2 = engined_client.to_torch(bits.view(tensors.BFLOAT16))
        assert t2.dtype == torch.bfloat16 and torch.equal(t, t2)
    with pytest.raises(TypeError):
        engined_client.to_torch(np.zeros(2, np.float32), bfloat16=True)
    asm = tensors.Assembler(as_torch=True)
    [(_, w)] = asm.feed(pb.ParamBucket(slices=[pb.TensorSlice(
        name="w", dtype=pb.BFLOAT16, shape=[4], tensor_bytes=8, length=8)],
        data=bits.tobytes(), last=True))
    assert w.dtype == torch.bfloat16 and torch.equal(w, t)


def test_health_request_bytes():
    assert _api._health_request("") == b""
    assert _api._health_request("ab") == b"\x0a\x02ab"
    long = "s" * 200
    assert _api._health_request(long) == b"\x0a\xc8\x01" + long.encode()
    assert _api._health(b"\x08\x01") == "SERVING" and _api._health(b"") == "UNKNOWN"
    assert _api._health(b"\x08\x07") == "UNKNOWN"
