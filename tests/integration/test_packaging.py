"""The Python package's build (client/python): with no protoc binary on
PATH, the sdist carries engine.proto and no stubs, a wheel builds from the
sdist alone and from the source tree, the wheel imports with Debian's
protobuf (4.21) and with the venv's current one, and no build writes into
the source tree (git status, ignored files included, is unchanged).

Runs with the PyPI venv's python (its setuptools and grpcio-tools, the
build dependencies; no network: builds call setuptools' PEP 517 backend
directly). Run: build/venv-pypi/bin/python -m pytest tests/integration/test_packaging.py
"""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PKG = os.path.join(ROOT, "client", "python")
PROTO = os.path.join(ROOT, "proto", "engined", "v1", "engine.proto")
BIN = os.path.dirname(os.path.abspath(sys.executable))

# Imports the unpacked wheel and checks its messages against engine.proto.
CHECK = r"""
import os, re, sys
site, proto = sys.argv[1], sys.argv[2]
sys.path.insert(0, site)
import google.protobuf
import engined_client
from engined_client import pb, results
from engined_client._proto import engine_pb2
assert engine_pb2.__file__.startswith(site), engine_pb2.__file__
assert engined_client.pb is engine_pb2
names = re.findall(r"^message (\w+)", open(proto).read(), re.M)
assert names and all(hasattr(pb, n) for n in names), names
svc = pb.DESCRIPTOR.services_by_name["TrainingEngine"]
assert len(svc.methods) == len(re.findall(r"^\s*rpc ", open(proto).read(), re.M))
m = pb.GetStatusResponse(step=4, placement=pb.Placement(model=True), last_request_id="x")
st = results.Status.from_proto(pb.GetStatusResponse.FromString(m.SerializeToString()))
assert st.step == 4 and st.placement.model and st.last_request_id == "x"
assert open(os.path.join(os.path.dirname(engine_pb2.__file__), "engine.proto")).read() \
    == open(proto).read()
print("ok protobuf", google.protobuf.__version__)
"""


def git_status():
    if shutil.which("git") is None:
        return None
    return subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--ignored", "--",
                           "client/python"], check=True, capture_output=True,
                          text=True).stdout


def backend(call, cwd, out):
    """setuptools.build_meta.<call>(out) in cwd with only the venv on PATH
    (no protoc); returns the file it made."""
    env = dict(os.environ, PATH=BIN, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-c",
                        "import sys; from setuptools import build_meta as b; "
                        "print(b.%s(sys.argv[1]))" % call, out],
                       cwd=cwd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return os.path.join(out, r.stdout.strip().splitlines()[-1])


def check_import(python, site, **env_extra):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONDONTWRITEBYTECODE="1", **env_extra)
    r = subprocess.run([python, "-c", CHECK, site, PROTO], cwd="/", env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "ok protobuf" in r.stdout, (python, r.stdout + r.stderr)
    return r.stdout.strip()


@pytest.fixture(scope="module")
def before():
    try:
        import grpc_tools  # noqa: F401
        import setuptools  # noqa: F401
    except ImportError:
        pytest.skip("needs setuptools and grpcio-tools (tests/integration/setup_venv.sh)")
    assert shutil.which("protoc", path=BIN) is None
    return git_status()


def test_sdist_then_wheel_without_protoc(before, tmp_path):
    sdist = backend("build_sdist", PKG, str(tmp_path))
    with tarfile.open(sdist) as t:
        names = t.getnames()
        top = names[0].split("/")[0]
        assert top + "/proto/engine.proto" in names, names
        assert t.extractfile(top + "/proto/engine.proto").read() == open(PROTO, "rb").read()
        assert not [n for n in names if n.endswith("engine_pb2.py")], names
        assert top + "/engined_client/aio.py" in names
        t.extractall(tmp_path / "src")
    # The sdist builds alone: the repository's proto is out of its reach.
    src = tmp_path / "src" / top
    wheel = backend("build_wheel", str(src), str(tmp_path / "whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        for f in ("engined_client/_proto/engine_pb2.py", "engined_client/_proto/engine.proto",
                  "engined_client/aio.py", "engined_client/results.py"):
            assert f in names, (f, names)
        meta = z.read([n for n in names if n.endswith("METADATA")][0]).decode()
        assert re.search(r"^Requires-Dist: ml-dtypes", meta, re.M), meta
        stub = z.read("engined_client/_proto/engine_pb2.py").decode()
        assert "runtime_version" not in stub and "grpcio-tools" in stub
        z.extractall(tmp_path / "site")
    print(check_import(sys.executable, str(tmp_path / "site")))
    print(check_import(sys.executable, str(tmp_path / "site"),
                       PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python"))
    if os.path.exists("/usr/bin/python3"):  # Debian's protobuf 4.21
        print(check_import("/usr/bin/python3", str(tmp_path / "site")))
    assert git_status() == before


def test_wheel_from_source_tree_writes_nothing_there(before, tmp_path):
    """What `pip install client/python` does (an in-place build)."""
    wheel = backend("build_wheel", PKG, str(tmp_path))
    with zipfile.ZipFile(wheel) as z:
        assert "engined_client/_proto/engine_pb2.py" in z.namelist()
    assert git_status() == before
    assert not os.path.exists(os.path.join(PKG, "engined_client", "_proto", "engine_pb2.py"))
