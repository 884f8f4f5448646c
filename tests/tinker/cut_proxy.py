"""cut_proxy.py — a TCP proxy in front of the gateway that cuts chosen HTTP
exchanges: the request reaches the gateway, its reply is dropped and the
connection closed, as a network failure mid-call does. The SDK then
retries the call."""
import asyncio
import threading


class CutProxy:
    def __init__(self, upstream_port, cuts):
        """cuts: {path prefix (b"POST /api/v1/optim_step"): how many of its
        replies to drop}."""
        self.upstream_port = upstream_port
        self.cuts = dict(cuts)
        self.cut = []                     # the request lines cut, in order
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait()
        self.url = "http://127.0.0.1:%d" % self.port

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _conn(self, cr, cw):
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        state = {"drop": False}

        async def up():
            while data := await cr.read(1 << 16):
                for prefix, n in self.cuts.items():
                    if n > 0 and data.startswith(prefix):
                        self.cuts[prefix] = n - 1
                        self.cut.append(prefix.decode())
                        state["drop"] = True
                uw.write(data)
                await uw.drain()
            uw.close()

        async def down():
            while data := await ur.read(1 << 16):
                if state["drop"]:
                    break  # the gateway answered: drop it and cut the line
                cw.write(data)
                await cw.drain()
            cw.transport.abort()
            uw.transport.abort()

        await asyncio.gather(up(), down(), return_exceptions=True)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
