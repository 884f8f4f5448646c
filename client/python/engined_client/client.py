"""EngineClient: one method per RPC of engined.v1.TrainingEngine, numpy in
and typed results out (results.py); the methods themselves are _api.Api,
shared with the asyncio client (aio.AsyncEngineClient).

Errors raise EngineError (a grpc.RpcError) whose code() is the gRPC status
and details() the daemon's message, which names the offending field.
"""
import contextlib
import threading
import time

import grpc

from ._api import Api, _loss_spec, _MODES, _PER_TOKEN, param_request  # noqa: F401
from ._pb import pb  # noqa: F401
from ._progress import POLL_S, Reporter
from ._rpc import (REQUEST_ID_KEY, RETRYABLE, SERVICE, STATE_CHANGING, Attempts,  # noqa: F401
                   EngineError, channel_options, credentials, keep_heap_pages, wrap)
from .tensors import DTYPES as _DTYPES, np_dtype as _np_dtype  # noqa: F401
from .tensors import Assembler, _bf16_dtype, parse_bucket, tensor, to_numpy, to_torch  # noqa: F401

# The names this module had before the shared ones moved to _rpc.py.
_SVC = SERVICE
_STATE_CHANGING = STATE_CHANGING
_RETRYABLE = RETRYABLE
_wrap = wrap


class _AuthInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                       grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call (works on plaintext
    loopback channels too, where grpc's call credentials are refused)."""

    def __init__(self, token):
        self._md = ("authorization", "Bearer " + token)

    def _details(self, d):
        md = list(d.metadata or []) + [self._md]
        return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

    def intercept_unary_unary(self, cont, d, req):
        return cont(self._details(d), req)

    def intercept_unary_stream(self, cont, d, req):
        return cont(self._details(d), req)

    def intercept_stream_unary(self, cont, d, it):
        return cont(self._details(d), it)

    def intercept_stream_stream(self, cont, d, it):
        return cont(self._details(d), it)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d, metadata):
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


class EngineClient(Api):
    """A synchronous client. target: "127.0.0.1:50051" or "unix:/path".
    timeout: default deadline in seconds for each call (None: no deadline).

    Security (see README "Securing the daemon"):
      token: bearer token sent as `authorization: Bearer <token>`.
      root_certificates: CA (PEM bytes or a file path) -> TLS.
      certificate_chain, private_key: client certificate (mutual TLS).
      server_name: name to check the server certificate against when it
        differs from the target's host (tests, IP addresses).
    channel: a grpc.Channel to use instead of one made from target and the
      options above (the token is still added).

    Exactly once: every state-changing call carries a fresh request id
    (`engined-request-id` metadata; request_id= gives one); the daemon
    answers a repeat of an id with the first call's outcome and never
    applies it twice. retries: how many times a call that failed
    UNAVAILABLE or DEADLINE_EXCEEDED is sent again with the same id (after
    retry_backoff seconds, doubling), so a retry of a call that did run
    returns its result instead of running again.

    Results: the typed results of results.py (InitializeResult, StepResult,
    Status, ...), fields named as in engine.proto."""

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
                channel = grpc.secure_channel(target, creds, options=opts)
            else:
                channel = grpc.insecure_channel(target, options=opts)
        self.channel = channel
        self._raw_channel = channel
        if token:
            self.channel = grpc.intercept_channel(self.channel, _AuthInterceptor(token))
        self._unary = {}
        self.retries = retries
        self.retry_backoff = retry_backoff

    def close(self):
        self._raw_channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- plumbing ---------------------------------------------------------

    def _call(self, method, req, resp_cls, timeout=None, request_id=None):
        """Send req to `method` (the request id and retries of
        _rpc.Attempts); returns the reply message."""
        f = self._unary.get(method)
        if f is None:
            f = self.channel.unary_unary(
                SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=resp_cls.FromString)
            self._unary[method] = f
        attempts = Attempts(method, self.retries, self.retry_backoff, request_id)
        while True:
            try:
                return f(req, timeout=self._timeout(timeout), metadata=attempts.metadata)
            except grpc.RpcError as e:
                delay = attempts.retry_delay(e)
                if delay is None:
                    raise wrap(e) from None
            time.sleep(delay)

    def _rpc(self, method, req, resp_cls, convert, timeout=None, request_id=None,
             progress=None):
        if progress is None:
            return convert(self._call(method, req, resp_cls, timeout, request_id))
        rep = Reporter(progress, method)
        with self._polling(rep):
            out = convert(self._call(method, req, resp_cls, timeout, request_id))
        rep.finish()
        return out

    @contextlib.contextmanager
    def _polling(self, rep):
        """Feed rep with GetStatus every POLL_S seconds from a helper
        thread (where progress callbacks run) until the block ends."""
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                try:
                    rep.feed(self._call("GetStatus", pb.GetStatusRequest(),
                                        pb.GetStatusResponse, 10))
                except grpc.RpcError:
                    pass
                stop.wait(POLL_S)
        t = threading.Thread(target=poll, name="engined-progress", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()

    def _rpc_raw(self, method, data, timeout, convert):
        f = self.channel.unary_unary(method)
        try:
            return convert(f(data, timeout=self._timeout(timeout)))
        except grpc.RpcError as e:
            raise wrap(e) from None

    def _stream(self, method, req, deserialize, timeout=None):
        """A server stream of `method` (no request id, no retry): the grpc
        call, an iterator of deserialize(message); .cancel() stops it."""
        f = self.channel.unary_stream(
            SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=deserialize)
        return f(req, timeout=self._timeout(timeout))

    def _rpc_stream(self, method, req, resp_cls, convert, timeout=None):
        """convert(the list of every reply of a server stream)."""
        call = self._stream(method, req, resp_cls.FromString, timeout)
        try:
            return convert(list(call))
        except grpc.RpcError as e:
            raise wrap(e) from None
        finally:
            call.cancel()

    def _stream_items(self, method, req, resp_cls, items, timeout=None):
        """A generator of what items(reply) lists, reply by reply; the call
        starts at the first next() and is cancelled when the generator
        ends or is closed."""
        call = self._stream(method, req, resp_cls.FromString, timeout)
        try:
            for rep in call:
                yield from items(rep)
        except grpc.RpcError as e:
            raise wrap(e) from None
        finally:
            call.cancel()

    # --- weights ----------------------------------------------------------

    def get_per_tensor_param(self, dtype="float32", names=None, bucket_bytes=0,
                             timeout=None, split=False, adapter="",
                             adapter_view="adapter"):
        """The raw stream of ParamBucket messages (a grpc call iterator;
        .cancel() stops it). split: tensors.RawBucket messages instead,
        whose data is a view of the received bytes (one copy less)."""
        return self._stream("GetPerTensorParam",
                            param_request(dtype, names, bucket_bytes, adapter, adapter_view),
                            parse_bucket if split else pb.ParamBucket.FromString, timeout)

    def stream_weights(self, dtype="float32", names=None, bucket_bytes=0, timeout=None,
                       as_torch=False, progress=None, adapter="",
                       adapter_view="adapter"):
        """Yield (name, array) per parameter in Hugging Face naming,
        reassembled from the buckets. dtype: "float32", "bfloat16" or
        "float16". bfloat16 arrays have the dtype ml_dtypes.bfloat16 (the
        package depends on ml-dtypes); where ml_dtypes is missing (Debian's
        python3 has no package of it) they are uint16 arrays of the bf16
        bit patterns instead (tensors.HAVE_ML_DTYPES says which).
        as_torch: yield torch tensors (torch.bfloat16 made from the bits,
        no float32 round trip); needs torch. The arrays are writable and
        not shared. Closing the generator early cancels the stream.
        progress: as initialize's, in bytes sent (phase "send").
        adapter: a LoRA adapter's tensors instead of the base model's, as
        adapter_view says: "adapter" (its lora_A / lora_B in PEFT's names),
        "base" (the base under verl's base_layer names) or "merged" (the
        base with W + scale B A, Hugging Face names)."""
        asm = Assembler(as_torch)
        rep = Reporter(progress, "GetPerTensorParam") if progress is not None else None
        call = self.get_per_tensor_param(dtype, names, bucket_bytes, timeout, split=True,
                                         adapter=adapter, adapter_view=adapter_view)
        try:
            with self._polling(rep) if rep else contextlib.nullcontext():
                for bucket in call:
                    yield from asm.feed(bucket)
            asm.finish()
            if rep:
                rep.finish()
        except grpc.RpcError as e:
            raise wrap(e) from None
        finally:
            call.cancel()
