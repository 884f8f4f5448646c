"""st.py — a minimal safetensors reader/writer for the parity suite.

The format (https://huggingface.co/docs/safetensors): an 8-byte
little-endian header length, a JSON header {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the raw
little-endian data. Only what the suite needs: F32 (and F64 for debugging
dumps) to and from numpy. Kept here so that the suite runs with the system
python (Debian python3-torch + python3-numpy) without the PyPI package.
"""
import json
import struct

import numpy as np

_DT = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I32": np.dtype("<i4"),
       "I64": np.dtype("<i8")}
_DT_REV = {v: k for k, v in _DT.items()}


def save(path, tensors, metadata=None):
    """Write {name: ndarray} to path; arrays are stored C-contiguous,
    little-endian, in name order (as the Rust implementation does)."""
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dt = a.dtype.newbyteorder("<")
        if dt not in _DT_REV:
            raise ValueError("%s: unsupported dtype %s" % (name, a.dtype))
        b = a.astype(dt, copy=False).tobytes()
        header[name] = {"dtype": _DT_REV[dt], "shape": list(a.shape),
                "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)   # align data to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load(path):
    """Return ({name: ndarray}, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: truncated" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("%s: header length %d beyond the file" % (path, n))
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, info in header.items():
        dt = _DT.get(info["dtype"])
        if dt is None:
            raise ValueError("%s: %s: unsupported dtype %s" % (path, name, info["dtype"]))
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * dt.itemsize or base + e > len(data):
            raise ValueError("%s: %s: bad data_offsets" % (path, name))
        out[name] = np.frombuffer(data, dtype=dt, count=count,
                      offset=base + b).reshape(shape).copy()
    return out, meta
