"""The Prometheus endpoint of the real engined (metrics.listen): scraped
after a known sequence of RPCs, every value checked against what the RPCs
returned; plus one log line per RPC.

The two tests share one daemon (conftest.py's `daemon`, with
--metrics-listen) and run in this order: the second counts the log lines of
the RPCs of the first. Run from the source root (meson runs it through
run_py.sh): ENGINED_BIN=build/daemon/engined
PYTHONPATH=client/python:build/client/python
/usr/bin/python3 -m pytest tests/integration/test_metrics.py
"""
import re
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from engined_client import EngineClient


@pytest.fixture(scope="module")
def daemon_args():
    """The shared daemon (conftest.py's `daemon`) serves metrics too."""
    return ("--metrics-listen", "127.0.0.1:0")


def metrics_port(d):
    m = re.search(r"metrics on http://\S+ \(port (\d+)[;)]", d.log_text())
    assert m, d.log_text()
    return int(m.group(1))


def scrape(port, path="/metrics", method="GET"):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
        text = r.read().decode()
    vals = {}
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        key, v = line.rsplit(" ", 1)
        vals[key] = float(v)
    return text, vals


def test_metrics_after_known_rpcs(daemon):
    port = metrics_port(daemon)
    c = EngineClient(daemon.addr, timeout=60)
    t0 = time.time()
    for _ in range(3):
        c.get_status()
    ini = c.initialize(replace=True, preset="tiny", seed=2, optimizer={"lr": 2e-3})
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1024, 96).astype(np.int32)
    c.forward_backward(ids, [48, 48], loss="sft")
    c.forward_backward(ids[:64], [32, 32], loss="sft")
    c.forward_backward(ids, [96], forward_only=True)
    try:
        c.forward_backward(ids, [95], loss="sft")
        raise AssertionError("bad seq_lens accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    step = c.optimizer_step()
    t_ck0 = time.time()
    c.save_checkpoint("m/ck", global_step=1)
    t_ck1 = time.time()
    w = dict(c.stream_weights(bucket_bytes=1 << 16))
    st = c.get_status()
    c.close()

    text, v = scrape(port)
    rpc = 'engined_rpc_total{method="%s",code="%s"}'
    assert v[rpc % ("GetStatus", "OK")] == 4
    assert v[rpc % ("Initialize", "OK")] == 1
    assert v[rpc % ("ForwardBackward", "OK")] == 3
    assert v[rpc % ("ForwardBackward", "INVALID_ARGUMENT")] == 1
    assert v[rpc % ("OptimizerStep", "OK")] == 1
    assert v[rpc % ("SaveCheckpoint", "OK")] == 1
    assert v[rpc % ("GetPerTensorParam", "OK")] == 1
    assert 'code="UNAUTHENTICATED"' not in text
    lat = 'engined_rpc_latency_seconds_%s{method="ForwardBackward"%s}'
    assert v[lat % ("count", "")] == 4
    assert v[lat % ("bucket", ',le="+Inf"')] == 4
    prefix = (lat % ("bucket", ""))[:-1]
    buckets = [v[k] for k in v if k.startswith(prefix)]
    assert len(buckets) == 12, buckets
    assert buckets == sorted(buckets), "histogram buckets must be cumulative"
    assert 0 < v[lat % ("sum", "")] < time.time() - t0
    assert abs(v['engined_rpc_duration_seconds_total{method="ForwardBackward",code="OK"}'] +
               v['engined_rpc_duration_seconds_total{method="ForwardBackward",code="INVALID_ARGUMENT"}']
               - v[lat % ("sum", "")]) < 1e-5
    # Engine figures: tokens of the training calls only (96 + 64).
    assert v["engined_tokens_trained_total"] == 160
    assert v["engined_optimizer_steps_total"] == 1
    assert v["engined_engine_step"] == 1 == st.step
    assert abs(v["engined_grad_norm"] - step.grad_norm) <= 1e-7 * step.grad_norm
    assert abs(v["engined_lr"] - st.lr) <= 1e-9 * max(st.lr, 1e-12)
    assert 0 < v["engined_step_seconds"] < time.time() - t0
    assert v["engined_parameters"] == ini.num_parameters
    assert v["engined_engine_initialized"] == 1 and v["engined_engine_busy"] == 0
    assert v["engined_queue_depth"] == 0 and v["engined_calls_in_flight"] == 0
    assert v["engined_checkpoints_saved_total"] == 1
    assert t_ck0 - 1 <= v["engined_last_checkpoint_timestamp_seconds"] <= t_ck1 + 1
    assert v['engined_memory_bytes{placement="host"}'] == st.memory.host_bytes
    assert v['engined_memory_bytes{placement="device"}'] == st.memory.device_bytes
    # Parameters, grads and AdamW moments: at least 4 x 4 bytes a parameter.
    assert st.memory.host_bytes + st.memory.device_bytes >= 16 * ini.num_parameters
    assert v["engined_resident_memory_bytes"] > 0
    payload = sum(a.nbytes for a in w.values())
    assert payload == 4 * ini.num_parameters
    # Stream bytes: the tensor data plus the small per-message headers.
    assert payload <= v["engined_stream_bytes_total"] < payload * 1.02 + 65536
    assert v['engined_build_info{version="0.1.0"}'] == 1
    # Scrapes are not RPCs; other paths and methods are refused.
    _, v2 = scrape(port)
    assert v2[rpc % ("GetStatus", "OK")] == 4
    for path, method, code in [("/", "GET", 404), ("/metrics", "POST", 405)]:
        try:
            scrape(port, path, method)
            raise AssertionError("%s %s accepted" % (method, path))
        except urllib.error.HTTPError as e:
            assert e.code == code, (path, e.code)


def test_one_log_line_per_rpc(daemon):
    log = daemon.log_text()
    lines = [x for x in log.split("\n") if " rpc GetStatus " in x]
    assert len(lines) == 4, lines
    for x in lines:
        assert re.search(r"info: rpc GetStatus peer=ipv4:127\.0\.0\.1:\d+ identity=- "
                         r"status=OK \d+\.\d ms$", x), x
    bad = [x for x in log.split("\n") if "status=INVALID_ARGUMENT" in x]
    assert len(bad) == 1 and "rpc ForwardBackward" in bad[0] and "seq_lens" in bad[0], bad
