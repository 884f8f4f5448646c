"""app.py — the HTTP API the Tinker SDK 0.38.0 speaks (docs/TINKER.md), on
Starlette (an ASGI framework; uvicorn serves it: cli.py). Each route parses
its body, asks gateway.py, and answers JSON, protobuf or a future.

Statuses: a request that is wrong in itself is 400 {"detail"} (the SDK's
BadRequestError: a user error, not retried); an unknown model, session,
sampler or checkpoint 404; a missing or unknown X-API-Key 401; an unknown
future 410 (a sample is resubmitted by the SDK; a training call fails
with the SDK's "Promise expired/broken"). What fails while a call runs is
its future's {"error", "category": "user"|"server"}."""
import asyncio
import contextlib
import logging

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from . import wire
from .engines import NoEngine
from .futures import Failed
from .wire import UserError

log = logging.getLogger("engined_tinker")
PROTO = "application/x-protobuf"
HOUSEKEEPING_S = 30.0  # expired checkpoints, results and sessions

# client/config: what the SDK is told (docs/TINKER.md 1.3). httpx rather
# than pyqwest; forward_backward chunks one after another; no server-side
# custom losses, sampling sessions to join, or batched future retrieval.
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False, "credential_default_source": "api_key",
    "use_pyqwest_transport": False, "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": False, "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False, "sample_join_sampling_session": False,
    "fwdbwd_max_chunk_bytes_count": 64 << 20,
}


def _err(status, msg):
    return JSONResponse({"detail": msg}, status_code=status)


def _future(rec, **extra):
    return JSONResponse(dict({"request_id": rec.request_id}, **extra))


async def _json(request):
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError("body: not JSON (%s)" % e) from None
    if not isinstance(body, dict):
        raise UserError("body: a JSON object is expected")
    return body


class Auth(BaseHTTPMiddleware):
    def __init__(self, app, keys):
        super().__init__(app)
        self.keys = keys

    async def dispatch(self, request, call_next):
        # healthz: for load balancers; files: signed URLs, fetched by the
        # SDK's CLI without the key (checkpoints.py).
        path = request.url.path
        if path.rstrip("/").endswith("/healthz") or path.startswith("/api/v1/files/"):
            return await call_next(request)
        key = request.headers.get("x-api-key")
        if not key:
            return _err(401, "X-API-Key header missing")
        if key not in self.keys():
            return _err(401, "X-API-Key is not an accepted key")
        return await call_next(request)


def make_app(gateway, api_keys, poll_s=25.0):
    """The ASGI app over a Gateway. api_keys: a callable returning the
    accepted keys (re-read on change by cli.py). poll_s: how long
    retrieve_future holds a pending future before answering 408."""
    g = gateway

    def route(fn):
        async def handler(request):
            try:
                return await fn(request)
            except UserError as e:
                return _err(400, str(e))
            except LookupError as e:
                return _err(404, str(e.args[0] if e.args else e))
            except NoEngine as e:
                return _err(400, str(e))
            except Failed as e:
                return _err(400 if e.category == "user" else 500, str(e))
        return handler

    async def client_config(request):
        return JSONResponse(CLIENT_CONFIG)

    async def dynamic_config(request):
        return _err(404, "no dynamic configuration: the SDK's defaults apply")

    async def create_session(request):
        sid = g.create_session(await _json(request))
        return JSONResponse({"session_id": sid, "type": "create_session"})

    async def heartbeat(request):
        body = await _json(request)
        try:
            g.session(body.get("session_id"))
        except LookupError as e:  # 410 stops the SDK's heartbeat loop
            return _err(410, str(e))
        return JSONResponse({"type": "session_heartbeat"})

    async def telemetry(request):
        return JSONResponse({"status": "accepted"})

    async def finish_session(request):
        sid = request.path_params["session_id"]
        g.session(sid)
        await g.end_session(sid, "finished by its client")
        return JSONResponse({})

    async def healthz(request):
        return JSONResponse({"status": "ok"})

    async def capabilities(request):
        return JSONResponse({"supported_models": [{
            "model_name": g.model_name, "max_context_length": g.max_context_length,
            "trainable": True, "sampleable": True}]})

    async def create_model(request):
        rec = g.create_model(await _json(request))
        return _future(rec)

    async def get_info(request):
        return JSONResponse(g.get_info(await _json(request)))

    async def unload_model(request):
        body = await _json(request)
        model_id = body.get("model_id")
        g.model(model_id)
        rec = g.futures.new("UnloadModel")

        async def run():
            await g.unload(model_id)
            return {"model_id": model_id, "type": "unload_model"}, "application/json"
        g.futures.run(rec, run())
        return _future(rec, model_id=model_id)

    async def forward_backward(request):
        raw = wire.decompress(await request.body(), request.headers.get("content-encoding"))
        ctype = request.headers.get("content-type", "")
        if PROTO not in ctype:
            raise UserError("forward_backward: Content-Type %r (the SDK 0.38 sends %s)"
                            % (ctype, PROTO))
        fb = wire.parse_forward_backward(raw)
        rec = g.forward_backward(fb)
        return _future(rec, model_id=fb.model_id)

    def training(method):
        async def handler(request):
            body = await _json(request)
            rec = method(body)
            return _future(rec, model_id=body.get("model_id"))
        return handler

    async def create_sampling_session(request):
        sid = await g.create_sampling_session(await _json(request))
        return JSONResponse({"sampling_session_id": sid, "type": "create_sampling_session"})

    async def get_sampler(request):
        return JSONResponse(g.get_sampler(request.path_params["sampler_id"]))

    async def asample(request):
        rec = g.asample(await _json(request))
        return _future(rec, sample_sequence_ids=rec.sequence_ids)

    async def retrieve_future(request):
        body = await _json(request)
        rid = body.get("request_id")
        rec = g.futures.get(rid)
        if rec is None:
            return _err(410, "request %r is unknown to this gateway (it restarted, or the "
                             "result expired): its outcome is lost" % (rid,))
        try:
            await asyncio.wait_for(asyncio.shield(rec.done.wait()), timeout=poll_s)
        except asyncio.TimeoutError:
            return JSONResponse({"type": "try_again", "request_id": rid,
                                 "queue_state": "active"}, status_code=408)
        if rec.failure is not None:
            return JSONResponse({"error": str(rec.failure), "category": rec.failure.category})
        if rec.media_type == PROTO:
            return Response(rec.result, media_type=PROTO)
        return JSONResponse(rec.result)

    def page(request, items, key):
        try:
            limit = int(request.query_params.get("limit", 100))
            offset = int(request.query_params.get("offset", 0))
        except ValueError:
            raise UserError("limit / offset: integers") from None
        return JSONResponse({key: items[offset:offset + limit],
                             "cursor": {"offset": offset, "limit": limit,
                                        "total_count": len(items)}})

    async def training_runs(request):
        return page(request, g.training_runs(), "training_runs")

    async def training_run(request):
        return JSONResponse(g.training_run(request.path_params["run_id"]))

    async def run_checkpoints(request):
        run = request.path_params["run_id"]
        g.training_run(run)
        return JSONResponse({"checkpoints": g.checkpoints.list(run)})

    async def checkpoints(request):
        return page(request, g.checkpoints.list(), "checkpoints")

    def checkpoint(request):
        return g.checkpoints.find(request.path_params["run_id"],
                                  request.path_params["checkpoint_id"])

    async def delete_checkpoint(request):
        g.checkpoints.delete(checkpoint(request))
        return JSONResponse({})

    async def checkpoint_ttl(request):
        g.checkpoints.set_ttl(checkpoint(request), (await _json(request)).get("ttl_seconds"))
        return JSONResponse({})

    async def external_weights_urls(request):
        return JSONResponse(g.checkpoints.signed_urls(checkpoint(request),
                                                      str(request.base_url)))

    async def files(request):
        return FileResponse(g.checkpoints.file(request.path_params["token"],
                                               request.path_params["name"]))

    async def weights_info(request):
        return JSONResponse(g.weights_info((await _json(request)).get("tinker_path")))

    v1 = "/api/v1/"
    routes = [
        Route(v1 + "client/config", route(client_config), methods=["POST"]),
        Route(v1 + "client/dynamic_config", route(dynamic_config), methods=["POST"]),
        Route(v1 + "create_session", route(create_session), methods=["POST"]),
        Route(v1 + "session_heartbeat", route(heartbeat), methods=["POST"]),
        Route(v1 + "telemetry", route(telemetry), methods=["POST"]),
        Route(v1 + "sessions/{session_id}/finish", route(finish_session), methods=["POST"]),
        Route(v1 + "healthz", route(healthz), methods=["GET"]),
        Route(v1 + "get_server_capabilities", route(capabilities), methods=["GET"]),
        Route(v1 + "create_model", route(create_model), methods=["POST"]),
        Route(v1 + "get_info", route(get_info), methods=["POST"]),
        Route(v1 + "unload_model", route(unload_model), methods=["POST"]),
        Route(v1 + "forward_backward", route(forward_backward), methods=["POST"]),
        Route(v1 + "optim_step", route(training(g.optim_step)), methods=["POST"]),
        Route(v1 + "save_weights", route(training(g.save_weights)), methods=["POST"]),
        Route(v1 + "load_weights", route(training(g.load_weights)), methods=["POST"]),
        Route(v1 + "save_weights_for_sampler", route(training(g.save_weights_for_sampler)),
              methods=["POST"]),
        Route(v1 + "create_sampling_session", route(create_sampling_session), methods=["POST"]),
        Route(v1 + "samplers/{sampler_id}", route(get_sampler), methods=["GET"]),
        Route(v1 + "asample", route(asample), methods=["POST"]),
        Route(v1 + "retrieve_future", route(retrieve_future), methods=["POST"]),
        Route(v1 + "training_runs", route(training_runs), methods=["GET"]),
        Route(v1 + "training_runs/{run_id}", route(training_run), methods=["GET"]),
        Route(v1 + "training_runs/{run_id}/checkpoints", route(run_checkpoints),
              methods=["GET"]),
        Route(v1 + "training_runs/{run_id}/checkpoints/{checkpoint_id:path}/ttl",
              route(checkpoint_ttl), methods=["PUT"]),
        Route(v1 + "training_runs/{run_id}/checkpoints/{checkpoint_id:path}"
              "/external_weights_urls", route(external_weights_urls), methods=["GET"]),
        Route(v1 + "training_runs/{run_id}/checkpoints/{checkpoint_id:path}",
              route(delete_checkpoint), methods=["DELETE"]),
        Route(v1 + "checkpoints", route(checkpoints), methods=["GET"]),
        Route(v1 + "save_weights_external", route(training(g.save_weights_external)),
              methods=["POST"]),
        Route(v1 + "weights_info", route(weights_info), methods=["POST"]),
        Route(v1 + "files/{token}/{name}", route(files), methods=["GET"]),
    ]

    async def housekeeping():
        period = min(HOUSEKEEPING_S, g.session_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            try:
                await g.housekeeping()
            except Exception:  # the next round tries again
                log.exception("housekeeping")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        g.engines.open()
        task = asyncio.ensure_future(housekeeping())
        try:
            yield
        finally:
            task.cancel()
            await g.engines.close()

    async def not_found(request, exc):
        return _err(404, "%s %s: not served by engined's Tinker gateway"
                    % (request.method, request.url.path))

    return Starlette(routes=routes, lifespan=lifespan,
                     middleware=[Middleware(Auth, keys=api_keys)],
                     exception_handlers={404: not_found, 405: not_found})
