"""rpc_expect.py — the one helper the integration tests use to expect a
call to fail: `expect(code, fn, *args, field=None, **kw)` calls fn, and
asserts it raised a gRPC error (grpc.RpcError, the clients' EngineError)
of status `code` whose message names `field` when given; it returns the
error (`expect_details`: its message)."""
import grpc


def expect(code, fn, *args, field=None, **kw):
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        assert e.code() == code, "expected %s, got %s: %s" % (code, e.code(), e.details())
        if field:
            assert field in (e.details() or ""), \
                "message %r does not name %r" % (e.details(), field)
        return e
    raise AssertionError("expected %s, the call succeeded" % code)


def expect_details(code, fn, *args, field=None, **kw):
    return expect(code, fn, *args, field=field, **kw).details()
