"""EngineClient: one method per RPC of engined.v1.TrainingEngine, numpy in
and out.

Errors raise EngineError (a grpc.RpcError) whose code() is the gRPC status
and details() the daemon's message, which names the offending field.
"""
import time
import uuid

import grpc
import numpy as np

try:
    from ._proto import engine_pb2 as pb
except ImportError:  # running from a source tree with stubs on PYTHONPATH
    import engine_pb2 as pb  # type: ignore

_SVC = "/engined.v1.TrainingEngine/"

_DTYPES = {
    "float32": pb.FLOAT32, "f32": pb.FLOAT32, "fp32": pb.FLOAT32,
    "bfloat16": pb.BFLOAT16, "bf16": pb.BFLOAT16,
    "float16": pb.FLOAT16, "f16": pb.FLOAT16, "fp16": pb.FLOAT16,
}

_MODES = {"idle": pb.MODE_IDLE, "train": pb.MODE_TRAIN, "eval": pb.MODE_EVAL}

# The request's per-token FLOAT32 arrays (the loss library's table,
# engines/loss/loss.h LOSS_REQUEST_INPUTS): the proto's Tensor fields but the
# INT32 ones (input_ids, target_ids).
_PER_TOKEN = tuple(f.name for f in pb.ForwardBackwardRequest.DESCRIPTOR.fields
                   if f.message_type is not None and f.message_type.name == "Tensor"
                   and f.name not in ("input_ids", "target_ids"))


class EngineError(grpc.RpcError):
    """A failed RPC: code() is a grpc.StatusCode, details() the message."""

    def __init__(self, code, details):
        super().__init__("%s: %s" % (code.name if code else "?", details))
        self._code = code
        self._details = details

    def code(self):
        return self._code

    def details(self):
        return self._details


def _wrap(err):
    return EngineError(err.code(), err.details())


def _bf16_dtype():
    try:
        import ml_dtypes  # optional: a real bfloat16 numpy dtype
        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return np.dtype(np.uint16)  # raw bf16 bits


def _np_dtype(dt):
    if dt == pb.FLOAT32:
        return np.dtype("<f4")
    if dt == pb.FLOAT16:
        return np.dtype("<f2")
    if dt == pb.BFLOAT16:
        return _bf16_dtype()
    if dt == pb.INT32:
        return np.dtype("<i4")
    if dt == pb.INT64:
        return np.dtype("<i8")
    if dt == pb.UINT8:
        return np.dtype("u1")
    raise ValueError("unknown dtype %r" % dt)


def tensor(array, dtype=None):
    """A Tensor message from a numpy array (or list)."""
    a = np.asarray(array)
    if dtype is None:
        dtype = {np.dtype("float32"): pb.FLOAT32, np.dtype("int32"): pb.INT32,
                 np.dtype("int64"): pb.INT64, np.dtype("uint8"): pb.UINT8,
                 np.dtype("float16"): pb.FLOAT16}.get(a.dtype)
        if dtype is None:
            raise TypeError("unsupported array dtype %s (cast to float32 or int32)" % a.dtype)
    a = np.ascontiguousarray(a.astype(_np_dtype(dtype).newbyteorder("<"), copy=False))
    return pb.Tensor(dtype=dtype, shape=list(a.shape), data=a.tobytes())


def to_numpy(t):
    """A numpy array from a Tensor message (None when absent)."""
    if t is None or (not t.data and not t.shape):
        return None
    return np.frombuffer(t.data, dtype=_np_dtype(t.dtype)).reshape(tuple(t.shape))


def _loss_spec(loss, options):
    if loss is None:
        return None
    opts = dict(options or {})
    if isinstance(loss, dict):
        loss = dict(loss)
        name = loss.pop("name")
        opts.update(loss)
    else:
        name = loss

    def text(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return repr(v)
        return str(v)
    return pb.LossSpec(name=name, options={k: text(v) for k, v in opts.items()})


# Request ids (engine.proto): the metadata key, the calls that carry one,
# and the failures after which the same id is sent again.
REQUEST_ID_KEY = "engined-request-id"
_STATE_CHANGING = {"Initialize", "SetMode", "ForwardBackward", "OptimizerStep", "ZeroGrad",
                   "LrSchedulerStep", "ToDevice", "SaveCheckpoint", "LoadCheckpoint"}
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


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


def _read(x):
    if x is None or isinstance(x, bytes):
        return x
    with open(x, "rb") as f:
        return f.read()


class EngineClient:
    """A synchronous client. target: "127.0.0.1:50051" or "unix:/path".
    timeout: default deadline in seconds for each call (None: no deadline).

    Security (see README "Securing the daemon"):
      token: bearer token sent as `authorization: Bearer <token>`.
      root_certificates: CA (PEM bytes or a file path) -> TLS.
      certificate_chain, private_key: client certificate (mutual TLS).
      server_name: name to check the server certificate against when it
        differs from the target's host (tests, IP addresses).

    Exactly once: every state-changing call carries a fresh request id
    (`engined-request-id` metadata); the daemon answers a repeat of an id
    with the first call's outcome and never applies it twice. retries: how
    many times a call that failed UNAVAILABLE or DEADLINE_EXCEEDED is sent
    again with the same id (after retry_backoff, doubling), so a retry of a
    call that did run returns its result instead of running again."""

    def __init__(self, target="127.0.0.1:50051", timeout=None,
                 max_message_bytes=1 << 30, options=None, token=None,
                 root_certificates=None, certificate_chain=None, private_key=None,
                 server_name=None, retries=0, retry_backoff=0.2):
        # A fixed 64 MiB receive window instead of gRPC's BDP probing: weight
        # streams (MiB-sized messages, one in flight) then run near raw TCP
        # speed at half the CPU per byte (tests/bench/bench_stream.c).
        opts = [("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.http2.bdp_probe", 0),
                ("grpc.http2.lookahead_bytes", 64 << 20)]
        if server_name:
            opts.append(("grpc.ssl_target_name_override", server_name))
        opts += list(options or [])
        self.target = target
        self.timeout = timeout
        if root_certificates is not None or certificate_chain is not None:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(root_certificates),
                private_key=_read(private_key),
                certificate_chain=_read(certificate_chain))
            self.channel = grpc.secure_channel(target, creds, options=opts)
        else:
            self.channel = grpc.insecure_channel(target, options=opts)
        self._raw_channel = self.channel
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
        f = self._unary.get(method)
        if f is None:
            f = self.channel.unary_unary(
                _SVC + method, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=resp_cls.FromString)
            self._unary[method] = f
        md = None
        if method in _STATE_CHANGING:
            md = [(REQUEST_ID_KEY, request_id or uuid.uuid4().hex)]
        delay = self.retry_backoff
        for attempt in range(self.retries + 1):
            try:
                return f(req, timeout=timeout if timeout is not None else self.timeout,
                         metadata=md)
            except grpc.RpcError as e:
                if md is None or attempt == self.retries or e.code() not in _RETRYABLE:
                    raise _wrap(e) from None
            time.sleep(delay)
            delay *= 2

    def call_raw(self, method, data, timeout=None):
        """Any method path with raw request bytes; returns raw reply bytes."""
        f = self.channel.unary_unary(method)
        try:
            return f(data, timeout=timeout if timeout is not None else self.timeout)
        except grpc.RpcError as e:
            raise _wrap(e) from None

    # --- RPCs -------------------------------------------------------------

    def initialize(self, *, preset="", hf_config_json="", model_path="",
                   model_type="", backend="", device="", seed=0, optimizer=None,
                   lr_scheduler=None, offload=None, max_tokens_per_micro_batch=0,
                   dist=None, bf16_matmul=False, timeout=None):
        """Build the engine. Exactly one of preset, hf_config_json (a dict or
        the JSON text), model_path. optimizer / lr_scheduler / offload / dist:
        dicts of the proto fields. Returns the InitializeResponse."""
        import json
        if isinstance(hf_config_json, dict):
            hf_config_json = json.dumps(hf_config_json)
        req = pb.InitializeRequest(
            preset=preset, hf_config_json=hf_config_json, model_path=model_path,
            model_type=model_type, backend=backend, device=device, seed=seed,
            max_tokens_per_micro_batch=max_tokens_per_micro_batch,
            bf16_matmul=bf16_matmul)
        if optimizer:
            req.optimizer.CopyFrom(pb.OptimizerConfig(**optimizer))
        if lr_scheduler:
            req.lr_scheduler.CopyFrom(pb.LrSchedulerConfig(**lr_scheduler))
        if offload:
            req.offload.CopyFrom(pb.OffloadConfig(**offload))
        if dist:
            req.dist.CopyFrom(pb.DistConfig(**dist))
        return self._call("Initialize", req, pb.InitializeResponse, timeout)

    def set_mode(self, mode, disable_auto_offload=False, timeout=None):
        """mode: "idle" | "train" | "eval" (or a pb.Mode value)."""
        m = _MODES[mode] if isinstance(mode, str) else mode
        return self._call("SetMode", pb.SetModeRequest(
            mode=m, disable_auto_offload=disable_auto_offload),
            pb.SetModeResponse, timeout)

    def forward_backward(self, input_ids, seq_lens, *, loss=None, loss_options=None,
                         forward_only=False, temperature=1.0,
                         return_log_probs=False, return_entropy=False,
                         return_values=False, max_tokens_per_micro_batch=0,
                         target_ids=None, timeout=None, request_id=None, **per_token):
        """input_ids: int32 [N] (packed); seq_lens: sum N. loss: a name
        ("sft", "ppo", ...) or a dict {"name": ..., option: value}; options
        are stringified. Per-token float32 [N] arrays by keyword: loss_mask,
        old_log_probs, ref_log_probs, advantages, returns, old_values,
        is_weights, token_weights; grad_log_probs, grad_entropy,
        grad_values with loss="custom" (see forward_backward_custom).
        target_ids: int32 [N], the token each entry's log-prob is of
        (default: the next token). request_id: this call's id (default: a
        fresh one). Returns a dict: loss, metrics, num_micro_batches and the
        numpy outputs asked for."""
        unknown = set(per_token) - set(_PER_TOKEN)
        if unknown:
            raise TypeError("unknown per-token arrays: %s" % ", ".join(sorted(unknown)))
        req = pb.ForwardBackwardRequest(
            input_ids=tensor(np.asarray(input_ids, dtype=np.int32).reshape(-1), pb.INT32),
            seq_lens=[int(s) for s in seq_lens], forward_only=forward_only,
            temperature=temperature, return_log_probs=return_log_probs,
            return_entropy=return_entropy, return_values=return_values,
            max_tokens_per_micro_batch=max_tokens_per_micro_batch)
        if target_ids is not None:
            req.target_ids.CopyFrom(
                tensor(np.asarray(target_ids, dtype=np.int32).reshape(-1), pb.INT32))
        spec = _loss_spec(loss, loss_options)
        if spec is not None:
            req.loss.CopyFrom(spec)
        for k, v in per_token.items():
            if v is not None:
                getattr(req, k).CopyFrom(
                    tensor(np.asarray(v, dtype=np.float32).reshape(-1), pb.FLOAT32))
        r = self._call("ForwardBackward", req, pb.ForwardBackwardResponse, timeout,
                       request_id)
        return {
            "loss": r.loss,
            "metrics": dict(r.metrics),
            "num_micro_batches": r.num_micro_batches,
            "log_probs": to_numpy(r.log_probs) if r.HasField("log_probs") else None,
            "entropy": to_numpy(r.entropy) if r.HasField("entropy") else None,
            "values": to_numpy(r.values) if r.HasField("values") else None,
        }

    def optimizer_step(self, timeout=None, request_id=None, **params):
        """Clip, AdamW, zero the gradients. params: this step's lr, beta1,
        beta2, eps, weight_decay, clip_grad in place of the configured ones
        (0 is a value: lr=0.0 applies only the weight decay). Returns
        OptimizerStepResponse (grad_norm, skipped, lr, step)."""
        return self._call("OptimizerStep", pb.OptimizerStepRequest(**params),
                          pb.OptimizerStepResponse, timeout, request_id)

    def zero_grad(self, timeout=None):
        """Drop the gradients accumulated since the last step."""
        self._call("ZeroGrad", pb.ZeroGradRequest(), pb.ZeroGradResponse, timeout)

    def lr_scheduler_step(self, timeout=None):
        return self._call("LrSchedulerStep", pb.LrSchedulerStepRequest(),
                          pb.LrSchedulerStepResponse, timeout).lr

    def to_device(self, device, model=True, optimizer=True, grad=True, timeout=None):
        """device: "cpu"/"host" (offload) or "cuda"/"device". Returns Placement."""
        return self._call("ToDevice", pb.ToDeviceRequest(
            device=device, model=model, optimizer=optimizer, grad=grad),
            pb.ToDeviceResponse, timeout).placement

    def save_checkpoint(self, path, global_step=0, max_to_keep=0, contents=None,
                        timeout=None, request_id=None):
        return self._call("SaveCheckpoint", pb.SaveCheckpointRequest(
            path=path, global_step=global_step, max_to_keep=max_to_keep,
            contents=list(contents or [])), pb.SaveCheckpointResponse, timeout, request_id)

    def load_checkpoint(self, path, contents=None, timeout=None):
        return self._call("LoadCheckpoint", pb.LoadCheckpointRequest(
            path=path, contents=list(contents or [])),
            pb.LoadCheckpointResponse, timeout).global_step

    def get_status(self, timeout=None):
        return self._call("GetStatus", pb.GetStatusRequest(), pb.GetStatusResponse,
                          timeout)

    def health(self, service="", timeout=None):
        """grpc.health.v1.Health/Check: "SERVING" or "NOT_SERVING"."""
        s = service.encode()
        raw = self.call_raw("/grpc.health.v1.Health/Check",
                            (b"\x0a" + bytes([len(s)]) + s) if s else b"", timeout)
        status = raw[1] if len(raw) >= 2 and raw[0] == 0x08 else 0
        return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}[status]

    def get_per_tensor_param(self, dtype="float32", names=None, bucket_bytes=0,
                             timeout=None):
        """The raw stream of ParamBucket messages (a grpc call iterator;
        .cancel() stops it)."""
        dt = _DTYPES[dtype] if isinstance(dtype, str) else dtype
        f = self.channel.unary_stream(
            _SVC + "GetPerTensorParam", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ParamBucket.FromString)
        return f(pb.GetPerTensorParamRequest(dtype=dt, names=list(names or []),
                                             bucket_bytes=bucket_bytes),
                 timeout=timeout if timeout is not None else self.timeout)

    def stream_weights(self, dtype="float32", names=None, bucket_bytes=0, timeout=None):
        """Yield (name, numpy array) per parameter in Hugging Face naming,
        reassembled from the buckets. bfloat16 arrays have ml_dtypes'
        bfloat16 dtype when ml_dtypes is installed, else uint16 (raw bits).
        Closing the generator early cancels the stream."""
        call = self.get_per_tensor_param(dtype, names, bucket_bytes, timeout)
        cur = None
        try:
            for bucket in call:
                data = bucket.data
                for s in bucket.slices:
                    if s.tensor_offset == 0:
                        cur = (s.name, s.dtype, tuple(s.shape), bytearray(s.tensor_bytes))
                    name, dt, shape, buf = cur
                    if s.name != name:
                        raise EngineError(grpc.StatusCode.DATA_LOSS,
                                          "slice of %s inside %s" % (s.name, name))
                    buf[s.tensor_offset:s.tensor_offset + s.length] = \
                        data[s.data_offset:s.data_offset + s.length]
                    if s.tensor_offset + s.length == s.tensor_bytes:
                        yield name, np.frombuffer(buf, dtype=_np_dtype(dt)).reshape(shape)
                        cur = None
        except grpc.RpcError as e:
            raise _wrap(e) from None
        finally:
            call.cancel()
