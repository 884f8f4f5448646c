"""What the sync and the async client share about calls: the errors, the
channel options and credentials, the process's heap policy for receiving
streams, and the one definition of request ids and retries (engine.proto's
header): the metadata key, the state-changing methods that carry an id, the
status codes after which the same id is sent again, and the backoff between
attempts."""
import ctypes
import platform
import threading
import uuid

import grpc

# Request ids (engine.proto): the metadata key, the calls that carry one,
# and the failures after which the same id is sent again.
REQUEST_ID_KEY = "engined-request-id"
STATE_CHANGING = frozenset({
    "Initialize", "SetMode", "ForwardBackward", "OptimizerStep", "ZeroGrad",
    "LrSchedulerStep", "ToDevice", "SaveCheckpoint", "LoadCheckpoint", "CreateAdapter",
    "DeleteAdapter"})
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

SERVICE = "/engined.v1.TrainingEngine/"


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


def wrap(err):
    """An EngineError from any grpc.RpcError (sync or grpc.aio)."""
    return EngineError(err.code(), err.details())


def new_request_id():
    return uuid.uuid4().hex


class Attempts:
    """The attempts of one unary call of `method`.

    metadata: what every attempt sends (extra, plus for a state-changing
    method `engined-request-id`: request_id, or a fresh one; the same on
    every attempt), None when empty. retry_delay(err): seconds to wait
    before sending the call again after err, or None when err is final
    (not a state-changing call, a code not in RETRYABLE, or `retries`
    attempts already repeated). The delay starts at backoff and doubles."""

    def __init__(self, method, retries=0, backoff=0.2, request_id=None, extra=()):
        md = list(extra)
        self._left = 0
        if method in STATE_CHANGING:
            md.append((REQUEST_ID_KEY, request_id or new_request_id()))
            self._left = retries
        self.metadata = md or None
        self._delay = backoff

    @property
    def request_id(self):
        for k, v in self.metadata or ():
            if k == REQUEST_ID_KEY:
                return v
        return None

    def retry_delay(self, err):
        if self._left <= 0 or err.code() not in RETRYABLE:
            return None
        self._left -= 1
        delay, self._delay = self._delay, self._delay * 2
        return delay


# glibc's mallopt parameters (malloc.h) and the values the C client sets
# too (client/transport_grpc.c: keep_heap_pages, which says why).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_TRIM_THRESHOLD = 64 << 20
_MMAP_THRESHOLD = 32 << 20
_heap_lock = threading.Lock()
_heap_kept = False


def keep_heap_pages():
    """Keep freed heap pages for reuse, once per process (glibc only; the
    clients call it when made). grpcio receives a stream into malloc'd
    slices and copies each message into a bytes object, all freed message
    by message: with glibc's default thresholds the heap's top went back to
    the kernel and every megabyte-sized bytes was a fresh mmap, so each
    message faulted its memory in again, zeroed (page faults were a third
    of stream_weights' CPU; docs/PERF.md). Raises the trim threshold to
    64 MiB and the mmap threshold to its 32 MiB ceiling (setting either
    turns off glibc's own raising of the mmap threshold); process-wide."""
    global _heap_kept
    with _heap_lock:
        if _heap_kept:
            return
        _heap_kept = True
        if platform.libc_ver()[0] != "glibc":
            return
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            return
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)


def channel_options(max_message_bytes=1 << 30, server_name=None, options=None):
    # A fixed 64 MiB receive window instead of gRPC's BDP probing: weight
    # streams (MiB-sized messages, one in flight) then run near raw TCP
    # speed at half the CPU per byte (tests/bench/bench_stream.c).
    opts = [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", 64 << 20)]
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return opts + list(options or [])


def _read(x):
    if x is None or isinstance(x, bytes):
        return x
    with open(x, "rb") as f:
        return f.read()


def credentials(root_certificates=None, certificate_chain=None, private_key=None):
    """TLS channel credentials, or None for a plaintext channel."""
    if root_certificates is None and certificate_chain is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(root_certificates), private_key=_read(private_key),
        certificate_chain=_read(certificate_chain))


def auth_metadata(token):
    return (("authorization", "Bearer " + token),) if token else ()
