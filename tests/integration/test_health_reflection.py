"""grpc.health.v1 and server reflection of the real engined, through the
official Python clients from PyPI (grpcio-health-checking,
grpcio-reflection: a dynamic stub built from reflection alone calls the
engine) and through grpclib (an independent implementation: health, and
reflection v1).

The tests share one daemon (conftest.py's `daemon` fixture); some start
their own. Run from the source root with the PyPI venv
(tests/integration/setup_venv.sh; meson runs it through run_py.sh):
ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python
build/venv-pypi/bin/python -m pytest tests/integration/test_health_reflection.py [-k name]
"""
import asyncio
import os
import signal
import threading
import time

import grpc
import pytest

from daemon_fixture import Daemon, wait_for

from engined_client import EngineClient
from engined_client.client import _AuthInterceptor

SC = grpc.StatusCode
SERVICES = {"engined.v1.TrainingEngine", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"}


def need(mod):
    try:
        return __import__(mod, fromlist=["x"])
    except ImportError:
        pytest.skip("%s not installed (tests/integration/setup_venv.sh)" % mod)


def test_health_check_official_client(daemon):
    hp = need("grpc_health.v1.health_pb2")
    hg = need("grpc_health.v1.health_pb2_grpc")
    with grpc.insecure_channel(daemon.addr) as ch:
        stub = hg.HealthStub(ch)
        S = hp.HealthCheckResponse
        assert stub.Check(hp.HealthCheckRequest(), timeout=10).status == S.SERVING
        assert stub.Check(hp.HealthCheckRequest(service="engined.v1.TrainingEngine"),
                          timeout=10).status == S.SERVING
        try:
            stub.Check(hp.HealthCheckRequest(service="no.Such"), timeout=10)
            raise AssertionError("unknown service answered")
        except grpc.RpcError as e:
            assert e.code() == SC.NOT_FOUND, e
        # Watch: the status now; SERVICE_UNKNOWN (not an error) for others.
        w = stub.Watch(hp.HealthCheckRequest(service=""), timeout=10)
        assert next(w).status == S.SERVING
        w.cancel()
        w = stub.Watch(hp.HealthCheckRequest(service="no.Such"), timeout=10)
        assert next(w).status == S.SERVICE_UNKNOWN
        w.cancel()


def test_health_watch_sees_draining():
    """Watch streams get NOT_SERVING as soon as SIGTERM starts the drain
    (while the running job finishes), then the stream ends UNAVAILABLE."""
    hp = need("grpc_health.v1.health_pb2")
    hg = need("grpc_health.v1.health_pb2_grpc")
    import numpy as np
    d = Daemon(safe_points=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        c.initialize(replace=True, preset="tiny")
        ch = grpc.insecure_channel(d.addr)
        seen = []

        def watch():
            try:
                for r in hg.HealthStub(ch).Watch(hp.HealthCheckRequest(), timeout=60):
                    seen.append((time.time(), r.status))
            except grpc.RpcError as e:
                seen.append((time.time(), e.code()))
        t = threading.Thread(target=watch)
        t.start()
        wait_for(lambda: seen, "the watch's first answer")
        ids = np.random.default_rng(0).integers(0, 1024, 6144).astype(np.int32)
        out = {}
        # The job is held at its first safe point (between micro-batches)
        # until the watch has seen NOT_SERVING: running, whatever the
        # machine's speed.
        d.hold_safe_points()
        job = threading.Thread(target=lambda: out.setdefault(
            "r", c.forward_backward(ids, [512] * 12, loss="sft", max_tokens_per_micro_batch=512)))
        job.start()
        while not c.get_status().busy:
            time.sleep(0.005)
        t_sig = time.time()
        d.signal(signal.SIGTERM)
        wait_for(lambda: len(seen) >= 2, "NOT_SERVING on the watch")
        d.release_safe_points()
        job.join()
        t_done = time.time()
        t.join()
        assert d.wait(30) == 0
        S = hp.HealthCheckResponse
        states = [s for _, s in seen]
        assert states == [S.SERVING, S.NOT_SERVING, SC.UNAVAILABLE], states
        t_ns = seen[1][0]
        # NOT_SERVING while the job was still running, not after.
        assert t_sig <= t_ns < t_done, (t_sig, t_ns, t_done)
        assert "r" in out
        ch.close()
        c.close()
    finally:
        d.stop()


WATCHER = r'''
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
w = ch.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=3600)
next(w)
print("watching", flush=True)
sys.stdin.read()
'''


def test_health_watch_ends_when_its_client_dies():
    """A Watch whose client process is killed is ended by the daemon (its
    log line, CANCELLED) while the daemon keeps serving, not at shutdown."""
    import subprocess
    import sys
    from daemon_fixture import wait_for
    d = Daemon()
    try:
        p = subprocess.Popen([sys.executable, "-c", WATCHER, d.addr], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "watching"
        assert "rpc Health.Watch" not in d.log_text()
        p.kill()
        p.wait()
        # A bound for a hung daemon, not a timing assertion.
        wait_for(lambda: "rpc Health.Watch" in d.log_text(), "the watch to end", timeout=60)
        line = [x for x in d.log_text().splitlines() if "rpc Health.Watch" in x][0]
        assert "status=CANCELLED" in line and "client went away" in line, line
        assert d.proc.poll() is None
        c = EngineClient(d.addr, timeout=30)
        assert c.health() == "SERVING"
        c.close()
    finally:
        assert d.stop() == 0


def test_reflection_official_client_builds_a_stub(daemon):
    need("grpc_reflection.v1alpha.proto_reflection_descriptor_database")
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import \
        ProtoReflectionDescriptorDatabase
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf < 4.21
        from google.protobuf.message_factory import MessageFactory
        GetMessageClass = MessageFactory().GetPrototype  # noqa: N806

    with grpc.insecure_channel(daemon.addr) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        assert set(db.get_services()) == SERVICES
        pool = DescriptorPool(db)
        svc = pool.FindServiceByName("engined.v1.TrainingEngine")
        names = {m.name for m in svc.methods}
        assert {"Initialize", "ForwardBackward", "GetPerTensorParam", "GetStatus"} <= names
        gpt = svc.methods_by_name["GetPerTensorParam"]
        assert gpt.output_type.full_name == "engined.v1.ParamBucket"

        def call(method, **fields):
            m = svc.methods_by_name[method]
            req_cls = GetMessageClass(m.input_type)
            resp_cls = GetMessageClass(m.output_type)
            f = ch.unary_unary("/%s/%s" % (svc.full_name, method),
                               request_serializer=lambda x: x.SerializeToString(),
                               response_deserializer=resp_cls.FromString)
            return f(req_cls(**fields), timeout=30)
        st = call("GetStatus")
        assert st.version == "0.1.0" and not st.initialized
        r = call("Initialize", preset="tiny", seed=9)
        assert r.engine_key == "language_model/native/cpu" and r.num_parameters > 0
        assert call("GetStatus").num_parameters == r.num_parameters
        # Files by name, and symbols that do not exist.
        fd = db.FindFileByName("engined/v1/engine.proto")
        assert fd.package == "engined.v1"
        try:
            db.FindFileContainingSymbol("engined.v1.Nope")
            raise AssertionError("unknown symbol found")
        except KeyError:
            pass
        h = pool.FindMethodByName("grpc.health.v1.Health.Watch")
        assert h.output_type.full_name == "grpc.health.v1.HealthCheckResponse"


def test_grpclib_health_and_reflection_v1(daemon):
    need("grpclib.client")
    hp = need("grpc_health.v1.health_pb2")
    from google.protobuf import descriptor_pb2
    from grpclib.client import Channel
    from grpclib.const import Cardinality
    from grpclib.reflection.v1 import reflection_grpc, reflection_pb2 as rp

    async def main():
        ch = Channel("127.0.0.1", daemon.port)
        try:
            # grpclib's own health_pb2 would clash with grpc_health's in the
            # default descriptor pool: its transport with grpc_health's messages.
            async with ch.request("/grpc.health.v1.Health/Check", Cardinality.UNARY_UNARY,
                                  hp.HealthCheckRequest, hp.HealthCheckResponse) as st:
                await st.send_message(hp.HealthCheckRequest(), end=True)
                h = await st.recv_message()
            stub = reflection_grpc.ServerReflectionStub(ch)
            async with stub.ServerReflectionInfo.open() as st:
                out = []
                for req in [rp.ServerReflectionRequest(list_services="*"),
                            rp.ServerReflectionRequest(
                                file_containing_symbol="grpc.health.v1.Health.Check"),
                            rp.ServerReflectionRequest(file_containing_symbol="x.Y"),
                            rp.ServerReflectionRequest(
                                all_extension_numbers_of_type="engined.v1.Tensor"),
                            rp.ServerReflectionRequest(file_by_filename="nope.proto")]:
                    await st.send_message(req)
                    out.append(await st.recv_message())
                await st.end()
            return h, out
        finally:
            ch.close()
    h, out = asyncio.run(main())
    assert h.status == 1  # SERVING
    assert {s.name for s in out[0].list_services_response.service} == SERVICES
    assert out[0].original_request.list_services == "*"
    fds = out[1].file_descriptor_response.file_descriptor_proto
    fd = descriptor_pb2.FileDescriptorProto.FromString(fds[0])
    assert fd.name == "grpc/health/v1/health.proto" and fd.service[0].name == "Health"
    assert out[2].error_response.error_code == 5  # NOT_FOUND
    assert out[3].all_extension_numbers_response.base_type_name == "engined.v1.Tensor"
    assert list(out[3].all_extension_numbers_response.extension_number) == []
    assert out[4].error_response.error_code == 5


def test_reflection_needs_a_token_when_tokens_are_on(daemon):
    need("grpc_reflection.v1alpha.proto_reflection_descriptor_database")
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import \
        ProtoReflectionDescriptorDatabase
    tf = os.path.join(daemon.tmp, "tokens")
    with open(tf, "w") as f:
        f.write("viewer:0123456789abcdef0123456789 read-only\n")
    os.chmod(tf, 0o600)
    d = Daemon("--token-file", tf)
    try:
        with grpc.insecure_channel(d.addr) as ch:
            try:
                ProtoReflectionDescriptorDatabase(ch).get_services()
                raise AssertionError("reflection without a token")
            except grpc.RpcError as e:
                assert e.code() == SC.UNAUTHENTICATED, e
            ich = grpc.intercept_channel(ch, _AuthInterceptor("0123456789abcdef0123456789"))
            assert set(ProtoReflectionDescriptorDatabase(ich).get_services()) == SERVICES
    finally:
        assert d.stop() == 0
    assert "rpc Reflection.v1alpha peer=ipv4:127.0.0.1:" in d.log_text()
    assert "identity=token:viewer status=OK" in d.log_text()
