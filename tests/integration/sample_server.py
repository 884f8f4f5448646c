"""A gRPC server of engined.v1.TrainingEngine/Sample alone, in the test's
process: the clients' side of the stream (what they send, how they print
or convert the replies, that closing early cancels the call) checked
without a daemon, over a real channel. The daemon's own Sample is tested
against the daemon.
"""
import threading
import time
from concurrent import futures

import grpc

from engined_client import pb

HANG = "hang"       # in a script: wait until the client cancels the call


class SampleServer:
    """script: for each call in turn, the list of what it does: a
    SampleResponse to send, (grpc.StatusCode, details) to end the call
    with, or HANG. requests: the SampleRequests received; cancelled: set
    once a HANG saw its call cancelled. Stop with stop() or `with`."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        self.cancelled = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler("engined.v1.TrainingEngine", {
            "Sample": grpc.unary_stream_rpc_method_handler(
                self._sample, request_deserializer=pb.SampleRequest.FromString,
                response_serializer=pb.SampleResponse.SerializeToString)})
        self.server.add_generic_rpc_handlers((handler,))
        self.addr = "127.0.0.1:%d" % self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _sample(self, req, context):
        self.requests.append(req)
        steps = self.script.pop(0)
        if HANG in steps:
            # A call that ends before its HANG has run out was cancelled.
            # The callback, not the HANG's own wait, says so: grpc stops
            # iterating a handler whose call is cancelled while a reply is
            # being sent, so the HANG may never run.
            ran_out = []
            context.add_callback(lambda: None if ran_out else self.cancelled.set())
        for step in steps:
            if step == HANG:
                deadline = time.monotonic() + 30
                while context.is_active() and time.monotonic() < deadline:
                    time.sleep(0.01)
                if context.is_active():
                    ran_out.append(True)
                return
            if isinstance(step, tuple):
                context.abort(*step)
            yield step

    def stop(self):
        self.server.stop(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
