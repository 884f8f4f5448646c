"""futures.py — the Tinker futures: a submission gets a request id at once;
retrieve_future long-polls its result (docs/TINKER.md section 4).

Request ids are "<boot>-<n>": boot is random per gateway process, so an id
from before a restart is never mistaken for a new one: it is unknown, and
retrieve_future answers 410 (the SDK resubmits a sample; a training call
reaches its caller as an error, never as another call's result). Results
are kept for `ttl_s` after they finish (a lost reply is polled again);
expire() drops older ones (the gateway's housekeeping calls it)."""
import asyncio
import itertools
import secrets
import time

import grpc

USER_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
                        grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.PERMISSION_DENIED,
                        grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAUTHENTICATED})


class Failed(Exception):
    """A call's failure as its future reports it: category "user" (the
    request is wrong; retrying it fails again) or "server"."""

    def __init__(self, message, category="user"):
        super().__init__(message)
        self.category = category


def failure_of(exc):
    """A Failed for any exception a call raised (engined's status decides
    the category)."""
    if isinstance(exc, Failed):
        return exc
    code = getattr(exc, "code", None)
    code = code() if callable(code) else None
    if code is not None:
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        return Failed("engined: %s: %s" % (code.name, details),
                      "user" if code in USER_CODES else "server")
    from .wire import UserError
    if isinstance(exc, UserError):
        return Failed(str(exc), "user")
    return Failed("gateway: %s: %s" % (type(exc).__name__, exc), "server")


class Record:
    """One future: kind (the SDK's request type), and when done either a
    result (bytes with a content type, or a JSON-able dict) or a Failed."""

    def __init__(self, request_id, kind):
        self.request_id = request_id
        self.kind = kind
        self.done = asyncio.Event()
        self.result = None
        self.media_type = "application/json"
        self.failure = None
        self.finished_at = None

    def finish(self, result=None, media_type="application/json", failure=None):
        self.result, self.media_type, self.failure = result, media_type, failure
        self.finished_at = time.monotonic()
        self.done.set()


class FutureStore:
    def __init__(self, ttl_s=3600.0):
        self.boot = secrets.token_hex(6)
        self._n = itertools.count(1)
        self._records = {}
        self.ttl_s = ttl_s

    def new(self, kind):
        rec = Record("%s-%d" % (self.boot, next(self._n)), kind)
        self._records[rec.request_id] = rec
        return rec

    def get(self, request_id):
        return self._records.get(request_id)

    def run(self, rec, coro):
        """Finish rec with what coro returns ((result, media type)) or raises."""
        async def go():
            try:
                result, media = await coro
            except asyncio.CancelledError:
                rec.finish(failure=Failed("the gateway is shutting down", "server"))
                raise
            except Exception as e:  # every failure reaches the client
                rec.finish(failure=failure_of(e))
            else:
                rec.finish(result, media)
        return asyncio.ensure_future(go())

    def expire(self):
        now = time.monotonic()
        old = [k for k, r in self._records.items()
               if r.finished_at is not None and now - r.finished_at > self.ttl_s]
        for k in old:
            del self._records[k]
