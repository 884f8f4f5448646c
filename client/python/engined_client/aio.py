"""AsyncEngineClient: the asyncio client (grpc.aio). The same methods as
EngineClient, each a coroutine returning the same typed result, so a
controller can keep its next call queued on the daemon while one runs:

    async with AsyncEngineClient(addr) as c:
        fb, st = await asyncio.gather(c.forward_backward(ids, lens, loss="sft"),
                                      c.get_status())
        async for name, array in c.stream_weights(dtype="bfloat16"):
            ...

Request ids and retries are EngineClient's (one definition in _rpc.py).
Make the client inside the event loop that uses it (grpc.aio binds a
channel to the loop it first runs in).
"""
import asyncio
import functools

import grpc
import grpc.aio

from ._api import Api, param_request
from ._pb import pb
from ._progress import POLL_S, Reporter
from ._rpc import (SERVICE, Attempts, auth_metadata, channel_options, credentials,
                   keep_heap_pages, wrap)
from .tensors import Assembler, parse_bucket


class AsyncEngineClient(Api):
    """An asyncio client; arguments as EngineClient's (channel: a
    grpc.aio.Channel). Every RPC method is a coroutine with EngineClient's
    signature and result; stream_weights is an async generator,
    sample_iter returns one and get_per_tensor_param returns the grpc.aio
    call (async-iterable, .cancel()). Close with `await c.close()` or
    `async with`."""

    def __init__(self, target="127.0.0.1:50051", timeout=None,
                 max_message_bytes=1 << 30, options=None, token=None,
                 root_certificates=None, certificate_chain=None, private_key=None,
                 server_name=None, retries=0, retry_backoff=0.2, channel=None):
        self.target = target
        self.timeout = timeout
        keep_heap_pages()
        if channel is None:
            opts = channel_options(max_message_bytes, server_name, options)
            creds = credentials(root_certificates, certificate_chain, private_key)
            if creds is not None:
                channel = grpc.aio.secure_channel(target, creds, options=opts)
            else:
                channel = grpc.aio.insecure_channel(target, options=opts)
        self.channel = channel
        # The token goes into each call's metadata (grpc.aio's interceptors
        # would do the same, one object per call kind).
        self._auth = auth_metadata(token)
        self._unary = {}
        self.retries = retries
        self.retry_backoff = retry_backoff

    async def close(self):
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # --- plumbing ---------------------------------------------------------

    async def _call(self, method, req, resp_cls, timeout=None, request_id=None):
        """Send req to `method` (the request id and retries of
        _rpc.Attempts); returns the reply message."""
        f = self._unary.get(method)
        if f is None:
            f = self.channel.unary_unary(
                SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=resp_cls.FromString)
            self._unary[method] = f
        attempts = Attempts(method, self.retries, self.retry_backoff, request_id, self._auth)
        while True:
            try:
                return await f(req, timeout=self._timeout(timeout),
                               metadata=attempts.metadata)
            except grpc.RpcError as e:
                delay = attempts.retry_delay(e)
                if delay is None:
                    raise wrap(e) from None
            await asyncio.sleep(delay)

    async def _rpc(self, method, req, resp_cls, convert, timeout=None, request_id=None,
                   progress=None):
        if progress is None:
            return convert(await self._call(method, req, resp_cls, timeout, request_id))
        rep = Reporter(progress, method)
        poller = asyncio.ensure_future(self._poll(rep))
        try:
            out = convert(await self._call(method, req, resp_cls, timeout, request_id))
        finally:
            await _stop(poller)
        rep.finish()
        return out

    async def _poll(self, rep):
        """Feed rep with GetStatus every POLL_S seconds (a task of the
        loop: progress callbacks run there) until cancelled."""
        while True:
            try:
                rep.feed(await self._call("GetStatus", pb.GetStatusRequest(),
                                          pb.GetStatusResponse, 10))
            except grpc.RpcError:
                pass
            await asyncio.sleep(POLL_S)

    async def _rpc_raw(self, method, data, timeout, convert):
        f = self.channel.unary_unary(method)
        try:
            return convert(await f(data, timeout=self._timeout(timeout),
                                   metadata=self._auth or None))
        except grpc.RpcError as e:
            raise wrap(e) from None

    def _stream(self, method, req, deserialize, timeout=None):
        """A server stream of `method` (no request id, no retry): the
        grpc.aio call, async-iterable of deserialize(message); .cancel()
        stops it."""
        f = self.channel.unary_stream(
            SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=deserialize)
        return f(req, timeout=self._timeout(timeout), metadata=self._auth or None)

    async def _rpc_stream(self, method, req, resp_cls, convert, timeout=None):
        """convert(the list of every reply of a server stream)."""
        call = self._stream(method, req, resp_cls.FromString, timeout)
        try:
            return convert([rep async for rep in call])
        except grpc.RpcError as e:
            raise wrap(e) from None
        finally:
            call.cancel()

    async def _stream_items(self, method, req, resp_cls, items, timeout=None):
        """An async generator of what items(reply) lists, reply by reply;
        the call starts at the first item and is cancelled when the
        generator ends, is closed (aclose) or its awaiting task is
        cancelled."""
        call = self._stream(method, req, resp_cls.FromString, timeout)
        try:
            async for rep in call:
                for item in items(rep):
                    yield item
        except grpc.RpcError as e:
            raise wrap(e) from None
        finally:
            call.cancel()

    # --- weights ----------------------------------------------------------

    def get_per_tensor_param(self, dtype="float32", names=None, bucket_bytes=0,
                             timeout=None, split=False, adapter="",
                             adapter_view="adapter"):
        """The raw stream of ParamBucket messages: a grpc.aio call (`async
        for`; .cancel() stops it). split: as EngineClient's."""
        return self._stream("GetPerTensorParam",
                            param_request(dtype, names, bucket_bytes, adapter, adapter_view),
                            parse_bucket if split else pb.ParamBucket.FromString, timeout)

    async def stream_weights(self, dtype="float32", names=None, bucket_bytes=0,
                             timeout=None, as_torch=False, progress=None, adapter="",
                             adapter_view="adapter"):
        """Async generator of (name, array): EngineClient.stream_weights
        (bfloat16 as ml_dtypes.bfloat16, uint16 bits without ml_dtypes;
        as_torch for torch tensors). To stop early, close it (`await
        gen.aclose()`, or `async with contextlib.aclosing(gen)`): that
        cancels the stream at once. progress, adapter: as EngineClient's."""
        asm = Assembler(as_torch)
        rep = Reporter(progress, "GetPerTensorParam") if progress is not None else None
        poller = asyncio.ensure_future(self._poll(rep)) if rep else None
        call = self.get_per_tensor_param(dtype, names, bucket_bytes, timeout, split=True,
                                         adapter=adapter, adapter_view=adapter_view)
        try:
            async for bucket in call:
                for item in asm.feed(bucket):
                    yield item
            asm.finish()
            if poller:
                await _stop(poller)
                rep.finish()
        except grpc.RpcError as e:
            raise wrap(e) from None
        finally:
            call.cancel()
            if poller:
                await _stop(poller)


async def _stop(task):
    """Cancel task and wait for it to end."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def as_coroutines(cls, base, names):
    """Give cls an `async def` for each method of base in names, awaiting
    what base's method returns (a coroutine when self is cls's): the
    methods written once for a sync and an async class (_api.Api for the
    clients, group._GroupBase for the groups) become coroutine functions."""
    def coroutine(impl):
        @functools.wraps(impl)
        async def method(self, *args, **kwargs):
            return await impl(self, *args, **kwargs)
        return method
    for name in names:
        setattr(cls, name, coroutine(getattr(base, name)))


as_coroutines(AsyncEngineClient, Api, Api.RPC_METHODS)
