"""Same-host weights: pick up a ShareWeights share and view its memory.

A share is a sealed memfd the daemon filled with the parameters (README
"Same-host weights"). open_share(ticket) connects to the ticket's unix
socket (AF_UNIX, SOCK_SEQPACKET), sends the 16 handle bytes, receives the
file descriptor (SCM_RIGHTS), checks that the file is sealed against
writes, shrinking and growing (fcntl F_GET_SEALS) and has the ticket's
size, and maps it. The result, SharedWeights, is a read-only mapping
name -> array: numpy views of the mapped file (no copy), bfloat16 as
ml_dtypes.bfloat16 where ml_dtypes is installed, else uint16 bit patterns
(as stream_weights); with as_torch, torch tensors over the same memory.

The file is mapped copy-on-write (MAP_PRIVATE): numpy views are marked
read-only; torch tensors have no such flag, and an in-place op on one
writes a private copy of the pages it touches (the share itself cannot
change: it is sealed), never crashes the process.
"""
import fcntl
import mmap
import os
import socket
from collections.abc import Mapping

import grpc
import numpy as np

from ._pb import pb
from ._rpc import EngineError
from .tensors import np_dtype

HANDLE_BYTES = 16
# Byte 0 of the daemon's answer (daemon/share_socket.h) -> the error raised.
_STATUS = {1: grpc.StatusCode.NOT_FOUND, 2: grpc.StatusCode.INVALID_ARGUMENT,
           3: grpc.StatusCode.UNAVAILABLE}
_REQUIRED_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def receive_fd(socket_path, handle, timeout=5.0):
    """The share's file descriptor for `handle` from the daemon's share
    socket (one use of the handle). Raises EngineError: NOT_FOUND for an
    unknown, used up or expired handle, UNAVAILABLE when the socket cannot
    be reached, PERMISSION_DENIED when its mode refuses this user."""
    handle = bytes(handle)
    if len(handle) != HANDLE_BYTES:
        raise ValueError("handle: %d bytes, not %d" % (len(handle), HANDLE_BYTES))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.settimeout(timeout)
        try:
            s.connect(socket_path)
        except PermissionError as e:
            raise EngineError(grpc.StatusCode.PERMISSION_DENIED,
                              "share socket %s: %s (the socket is mode 0660: this user "
                              "must be in its group)" % (socket_path, e.strerror)) from None
        except OSError as e:
            raise EngineError(grpc.StatusCode.UNAVAILABLE,
                              "share socket %s: %s" % (socket_path, e.strerror or e)) from None
        try:
            s.send(handle)
            msg, fds, _flags, _addr = socket.recv_fds(s, 512, 4)
        except OSError as e:
            raise EngineError(grpc.StatusCode.UNAVAILABLE,
                              "share socket %s: %s" % (socket_path, e.strerror or e)) from None
    finally:
        s.close()
    if not msg or msg[0] != 0 or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        if not msg:
            raise EngineError(grpc.StatusCode.UNAVAILABLE,
                              "share socket %s: closed without an answer" % socket_path)
        code = _STATUS.get(msg[0], grpc.StatusCode.INTERNAL)
        text = msg[1:].decode(errors="replace") if msg[0] else "no descriptor attached"
        raise EngineError(code, "share socket: " + text)
    return fds[0]


def _torch_dtype(dt):
    import torch
    return {pb.FLOAT32: torch.float32, pb.BFLOAT16: torch.bfloat16,
            pb.FLOAT16: torch.float16}[dt]


class SharedWeights(Mapping):
    """name -> array view of one share, in the share's order. ticket: the
    ShareTicket it came from (step: the engine step of the weights);
    nbytes: the file's size. close() (or `with`) drops the mapping: it is
    unmapped at once when no view is alive any more, else when the last
    one is freed (a view never outlives its memory)."""

    def __init__(self, fd, ticket, as_torch=False):
        self.ticket = ticket
        self.step = ticket.step
        self.nbytes = ticket.total_bytes
        self._mm = None
        self._mv = None
        self._views = {}
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            if seals & _REQUIRED_SEALS != _REQUIRED_SEALS:
                raise EngineError(grpc.StatusCode.FAILED_PRECONDITION,
                                  "share: the file is not sealed against writes and resizing "
                                  "(seals 0x%x); refusing to use it" % seals)
            size = os.fstat(fd).st_size
            if size != ticket.total_bytes:
                raise EngineError(grpc.StatusCode.DATA_LOSS,
                                  "share: the file has %d bytes, the index says %d"
                                  % (size, ticket.total_bytes))
            if size:
                self._mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                                     prot=mmap.PROT_READ | mmap.PROT_WRITE)
                # Views hold an export of the mapping through this (torch
                # keeps a reference to the object it was given, not an
                # export): while one lives the mapping cannot be closed.
                self._mv = memoryview(self._mm)
        finally:
            os.close(fd)
        for t in ticket.tensors:
            self._views[t.name] = self._view(t, size, as_torch)

    def _view(self, t, size, as_torch):
        dt = np_dtype(t.dtype)
        n = int(np.prod(t.shape, dtype=np.int64))
        if n * dt.itemsize != t.bytes or t.offset < 0 or t.offset + t.bytes > size:
            raise EngineError(grpc.StatusCode.DATA_LOSS,
                              "share: %s: %d bytes at %d do not fit shape %s in a file of %d"
                              % (t.name, t.bytes, t.offset, t.shape, size))
        if as_torch:
            import torch
            if n == 0:
                return torch.empty(t.shape, dtype=_torch_dtype(t.dtype))
            return torch.frombuffer(self._mv, dtype=_torch_dtype(t.dtype), count=n,
                                    offset=t.offset).reshape(t.shape)
        if n == 0:
            a = np.empty(t.shape, dtype=dt)
        else:
            a = np.frombuffer(self._mv, dtype=dt, count=n, offset=t.offset).reshape(t.shape)
        a.flags.writeable = False
        return a

    def __getitem__(self, name):
        if self._views is None:
            raise ValueError("share: closed")
        return self._views[name]

    def __iter__(self):
        return iter(self._views or ())

    def __len__(self):
        return len(self._views or ())

    @property
    def closed(self):
        return self._views is None

    def close(self):
        self._views = None
        self._mv = None  # the views' own references keep what they need
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views are alive: unmapped when the last one goes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "SharedWeights(%d tensors, %d bytes, step %d%s)" % (
            len(self.ticket.tensors), self.nbytes, self.step, ", closed" if self.closed else "")


def open_share(ticket, as_torch=False, timeout=5.0):
    """SharedWeights of a ShareTicket (EngineClient.request_share), in any
    process of the daemon's host that may open its socket: one use of the
    ticket's handle. as_torch: torch tensors instead of numpy arrays."""
    if as_torch:
        import torch  # noqa: F401  (fail before the handle is spent)
    fd = receive_fd(ticket.socket_path, ticket.handle, timeout)
    return SharedWeights(fd, ticket, as_torch)


__all__ = ["SharedWeights", "open_share", "receive_fd", "HANDLE_BYTES"]
