"""wire.py — the Tinker SDK's protobuf bodies (proto/tinker/tinker_wire.proto):
forward_backward's request read into plain arrays, and the protobuf results
of forward_backward and asample written from engined's replies.

Errors in what a client sent raise UserError (HTTP 400, or a future's
"user" error): the gateway never guesses at a malformed body."""
import hashlib
import math
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

try:
    from .._proto import tinker_wire_pb2 as tp
except ImportError:  # a source-tree run: meson's build/client/python
    import tinker_wire_pb2 as tp  # type: ignore

MAX_BODY_BYTES = 1 << 30  # a decompressed forward_backward body
_NP = {tp.DTYPE_FLOAT32: np.float32, tp.DTYPE_INT64: np.int64, tp.DTYPE_INT32: np.int32}


class UserError(Exception):
    """The client's request is wrong; the message says which part."""


def number(d, key, default, where, integer=False):
    """d[key] (default when absent or null) checked to be a finite number
    (an integer when asked; bool is neither): a JSON field of a request."""
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)) or \
            not math.isfinite(v):
        raise UserError("%s.%s: %r (%s)" % (where, key, v, "an integer" if integer
                                            else "a finite number"))
    return v


def token_ids(values, where):
    """A JSON list of token ids as int32 (each in [0, 2^31))."""
    if not isinstance(values, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2 ** 31
            for t in values):
        raise UserError("%s: token ids are integers in [0, 2^31)" % where)
    return values


@dataclass
class Datum:
    tokens: np.ndarray                    # int32 [N], the model input
    inputs: Dict[str, np.ndarray] = field(default_factory=dict)  # loss_fn_inputs


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int
    data: List[Datum]
    loss_fn: str
    config: Dict[str, object]
    forward_only: bool

    def key(self):
        """What makes two submissions of one seq_id the same call: a digest
        of the parsed content (the SDK re-encodes a retried body)."""
        h = hashlib.sha256(repr((self.model_id, self.seq_id, self.loss_fn, self.forward_only,
                                 sorted(self.config.items()), len(self.data))).encode())
        for d in self.data:
            h.update(b"datum%d" % d.tokens.size)
            h.update(d.tokens.tobytes())
            for k in sorted(d.inputs):
                a = d.inputs[k]
                h.update(repr((k, str(a.dtype), a.shape)).encode())
                h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()


def decompress(body, encoding):
    """The body as sent before its Content-Encoding (identity or zstd)."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc != "zstd":
        raise UserError("Content-Encoding %r is not supported (identity or zstd)" % encoding)
    import zstandard
    try:
        return zstandard.ZstdDecompressor().decompress(body, max_output_size=MAX_BODY_BYTES)
    except zstandard.ZstdError as e:
        raise UserError("body: not valid zstd (%s)" % e) from None


def _array(t, where):
    """A Tensor message as a numpy array of its declared shape."""
    dt = _NP.get(t.dtype)
    if dt is None:
        raise UserError("%s: dtype %d is not float32, int64 or int32" % (where, t.dtype))
    shape = [int(s) for s in t.shape]
    if any(s < 0 for s in shape) or len(shape) > 2:
        raise UserError("%s: shape %s (1 or 2 non-negative dimensions)" % (where, shape))
    size = math.prod(shape) if shape else None
    enc = t.WhichOneof("encoding")
    if enc == "sparse_csr":
        if len(shape) != 2:
            raise UserError("%s: a sparse tensor needs a 2-D shape" % where)
        c = t.sparse_csr
        values = _frombuffer(c.values, dt, where + ".values")
        crow = _frombuffer(c.crow_indices, np.int64, where + ".crow_indices")
        col = _frombuffer(c.col_indices, np.int64, where + ".col_indices")
        rows, cols = shape
        if (len(crow) != rows + 1 or crow[0] != 0 or np.any(np.diff(crow) < 0)
                or crow[-1] != len(values) or len(col) != len(values)
                or np.any(col < 0) or np.any(col >= cols)):
            raise UserError("%s: inconsistent sparse CSR indices for shape %s" % (where, shape))
        out = np.zeros(shape, dtype=dt)
        out[np.repeat(np.arange(rows), np.diff(crow)), col] = values
        return out
    a = _frombuffer(t.dense, dt, where)
    if size is None:
        return a
    if a.size != size:
        raise UserError("%s: %d values for shape %s" % (where, a.size, shape))
    return a.reshape(shape)


def _frombuffer(b, dt, where):
    if len(b) % np.dtype(dt).itemsize:
        raise UserError("%s: %d bytes is not a whole number of %s" % (where, len(b), np.dtype(dt)))
    return np.frombuffer(b, dtype=dt)


def _config(msg):
    cfg = {}
    for k, v in msg.loss_fn_config.items():
        cfg[k] = v
    for k, v in msg.loss_fn_config_v2.items():
        which = v.WhichOneof("value")
        cfg[k] = v.number if which == "number" else v.text if which == "text" else None
    return cfg


def parse_forward_backward(body):
    """A ForwardBackwardRequest body (already decompressed)."""
    m = tp.ForwardBackwardRequest()
    try:
        m.ParseFromString(body)
    except Exception as e:  # protobuf's DecodeError, whatever its module
        raise UserError("body: not a ForwardBackwardRequest protobuf (%s)" % e) from None
    data = []
    for i, d in enumerate(m.data):
        parts = []
        for j, ch in enumerate(d.model_input):
            kind = ch.WhichOneof("chunk")
            if kind != "encoded_text":
                raise UserError("data[%d].model_input[%d]: %s chunks are not supported "
                                "(engined serves text models)" % (i, j, kind or "empty"))
            parts.append(_frombuffer(ch.encoded_text.tokens, np.int32,
                                     "data[%d].model_input[%d].tokens" % (i, j)))
        # Provenance spans name the samples a datum came from; only
        # stable_reinforce (not served: losses.py) reads them, and
        # tinker-cookbook attaches them for every loss: ignored.
        tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        inputs = {k: _array(t, "data[%d].loss_fn_inputs[%r]" % (i, k))
                  for k, t in d.loss_fn_inputs.items()}
        data.append(Datum(tokens=tokens, inputs=inputs))
    return ForwardBackward(model_id=m.model_id, seq_id=m.seq_id, data=data, loss_fn=m.loss_fn,
                           config=_config(m), forward_only=m.forward_only)


def forward_backward_output(logprobs, metrics):
    """ForwardBackwardOutput bytes: one ArrayRecord per datum with
    "logprobs" (float32, the datum's shape) and metrics name -> float."""
    out = tp.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for lp in logprobs:
        lp = np.ascontiguousarray(lp, dtype=np.float32)
        rec = out.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=1)
        bt = rec.fields["logprobs"]
        bt.data = lp.tobytes()
        bt.offsets = np.array([0, lp.nbytes], dtype=np.int64).tobytes()
        bt.dtype = tp.DTYPE_FLOAT32
    for k, v in metrics.items():
        out.metrics[k] = float(v)
    return out.SerializeToString()


def sample_output(sequences, prompt_logprobs=None):
    """SampleResponse bytes. sequences: (stop_reason "stop"|"length",
    tokens, logprobs, top ids [n, k] or None, top logprobs or None) in
    sample order; prompt_logprobs: float32 [prompt length] or None."""
    out = tp.SampleResponse()
    for reason, tokens, logprobs, top_ids, top_lp in sequences:
        s = out.sequences.add(
            stop_reason=tp.STOP_REASON_STOP if reason == "stop" else tp.STOP_REASON_LENGTH,
            tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(logprobs, dtype=np.float32).tobytes())
        if top_ids is not None:
            n, k = top_ids.shape
            s.topk_sampled_logprobs.token_ids = np.ascontiguousarray(top_ids, np.int32).tobytes()
            s.topk_sampled_logprobs.logprobs = np.ascontiguousarray(top_lp, np.float32).tobytes()
            s.topk_sampled_logprobs.k = k
            s.topk_sampled_logprobs.length = n
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return out.SerializeToString()
