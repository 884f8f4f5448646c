"""Tensors: numpy arrays to and from Tensor messages, bfloat16, torch, and
the reassembly of GetPerTensorParam's buckets into whole tensors.

bfloat16 arrays have the dtype ml_dtypes.bfloat16 (PyPI `ml-dtypes`, a
dependency of this package). Where ml_dtypes cannot be imported (Debian's
python3 has no package of it) they are uint16 arrays of the bf16 bit
patterns instead: the same bytes; `a.view(np.uint16)` gives the bits in
both cases, and to_torch(a, bfloat16=True) reads the fallback's arrays.
HAVE_ML_DTYPES says which one this process gets.
"""
import grpc
import numpy as np

from ._pb import pb
from ._rpc import EngineError

try:
    import ml_dtypes as _ml_dtypes
    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
    HAVE_ML_DTYPES = True
except ImportError:
    BFLOAT16 = np.dtype(np.uint16)  # raw bf16 bits
    HAVE_ML_DTYPES = False

DTYPES = {
    "float32": pb.FLOAT32, "f32": pb.FLOAT32, "fp32": pb.FLOAT32,
    "bfloat16": pb.BFLOAT16, "bf16": pb.BFLOAT16,
    "float16": pb.FLOAT16, "f16": pb.FLOAT16, "fp16": pb.FLOAT16,
}


def _bf16_dtype():
    return BFLOAT16


def np_dtype(dt):
    """The numpy dtype of a DType value (BFLOAT16: see the module's doc)."""
    if dt == pb.FLOAT32:
        return np.dtype("<f4")
    if dt == pb.FLOAT16:
        return np.dtype("<f2")
    if dt == pb.BFLOAT16:
        return BFLOAT16
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
        if dtype is None and HAVE_ML_DTYPES and a.dtype == BFLOAT16:
            dtype = pb.BFLOAT16
        if dtype is None:
            raise TypeError("unsupported array dtype %s (cast to float32 or int32)" % a.dtype)
    a = np.ascontiguousarray(a.astype(np_dtype(dtype).newbyteorder("<"), copy=False))
    return pb.Tensor(dtype=dtype, shape=list(a.shape), data=a.tobytes())


def to_numpy(t):
    """A numpy array from a Tensor message (None when absent)."""
    if t is None or (not t.data and not t.shape):
        return None
    return np.frombuffer(t.data, dtype=np_dtype(t.dtype)).reshape(tuple(t.shape))


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("as_torch / to_torch need torch, which is not installed") from None
    return torch


def to_torch(array, bfloat16=None):
    """A torch tensor sharing `array`'s memory (a copy first when the array
    is read-only). bfloat16 arrays (ml_dtypes.bfloat16, or uint16 bit
    patterns with bfloat16=True) become torch.bfloat16 tensors from the
    bits, with no float32 round trip. Needs torch."""
    torch = _torch()
    a = np.asarray(array)
    if bfloat16 is None:
        bfloat16 = HAVE_ML_DTYPES and a.dtype == BFLOAT16
    if bfloat16 and a.dtype.itemsize != 2:
        raise TypeError("bfloat16=True needs 2-byte elements, not %s" % a.dtype)
    if not a.flags.writeable:
        a = a.copy()
    if bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


class RawBucket:
    """A ParamBucket as parse_bucket splits it: `slices` and `last` parsed
    by protobuf, `data` a memoryview of the received bytes (no copy)."""
    __slots__ = ("slices", "last", "data")


def _varint(b, i, n):
    v = shift = 0
    while i < n and shift < 64:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << shift
        if x < 0x80:
            return v, i
        shift += 7
    raise ValueError("truncated or overlong varint")


def parse_bucket(raw):
    """A serialized ParamBucket split where gRPC delivered it: every field
    but `data` (a few hundred bytes of TensorSlice metadata) parsed by
    protobuf, `data` (megabytes) located and viewed, not copied; the
    Python twin of the C client's param_bucket.c. Any valid encoding
    (fields in any order, unknown fields, a repeated `data` of which the
    last counts); a malformed one raises ValueError (gRPC reports the
    stream failed)."""
    mv = memoryview(raw)
    n = len(mv)
    i = 0
    rest = []
    data = mv[0:0]
    while i < n:
        start = i
        key, i = _varint(mv, i, n)
        wt = key & 7
        if wt == 2:
            ln, j = _varint(mv, i, n)
            if ln > n - j:
                raise ValueError("field beyond the message")
            i = j + ln
            if key >> 3 == 2:
                data = mv[j:i]
                continue
        elif wt == 0:
            _, i = _varint(mv, i, n)
        elif wt in (1, 5):
            i += 8 if wt == 1 else 4
            if i > n:
                raise ValueError("field beyond the message")
        else:
            raise ValueError("wire type %d" % wt)
        rest.append(mv[start:i])
    meta = pb.ParamBucket.FromString(b"".join(rest))
    out = RawBucket()
    out.slices, out.last, out.data = meta.slices, meta.last, data
    return out


class Assembler:
    """Whole tensors from ParamBucket messages: feed(bucket) returns the
    (name, array) pairs that bucket completes; finish() checks the stream
    did not end inside a tensor. as_torch: torch tensors instead of numpy
    arrays (bfloat16 ones from the bits, see to_torch)."""

    def __init__(self, as_torch=False):
        self.as_torch = as_torch
        if as_torch:
            _torch()
        self._cur = None

    def feed(self, bucket):
        done = []
        # One copy per byte: from the message's data (a memoryview: no
        # slice copies) into the tensor's own uninitialized buffer.
        data = memoryview(bucket.data)
        for s in bucket.slices:
            if s.tensor_offset == 0:
                self._cur = (s.name, s.dtype, tuple(s.shape),
                             np.empty(s.tensor_bytes, dtype=np.uint8))
            if self._cur is None:
                raise EngineError(grpc.StatusCode.DATA_LOSS,
                                  "slice of %s at offset %d without its start"
                                  % (s.name, s.tensor_offset))
            name, dt, shape, buf = self._cur
            if s.name != name:
                raise EngineError(grpc.StatusCode.DATA_LOSS,
                                  "slice of %s inside %s" % (s.name, name))
            buf[s.tensor_offset:s.tensor_offset + s.length] = np.frombuffer(
                data[s.data_offset:s.data_offset + s.length], dtype=np.uint8)
            if s.tensor_offset + s.length == s.tensor_bytes:
                a = buf.view(np_dtype(dt)).reshape(shape)
                if self.as_torch:
                    a = to_torch(a, bfloat16=dt == pb.BFLOAT16)
                done.append((name, a))
                self._cur = None
        return done

    def finish(self):
        if self._cur is not None:
            raise EngineError(grpc.StatusCode.DATA_LOSS,
                              "stream ended inside %s" % self._cur[0])
