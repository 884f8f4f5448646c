"""Build hook: generate engined_client/_proto/engine_pb2.py from the
repository's proto/engined/v1/engine.proto (the same file the daemon is built
from) with grpc_tools.protoc when installed, else the protoc binary."""
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "proto", "engined", "v1"))
OUT_DIR = os.path.join(HERE, "engined_client", "_proto")


def generate(out_dir=OUT_DIR):
    proto = os.path.join(PROTO_DIR, "engine.proto")
    if not os.path.exists(proto):
        if os.path.exists(os.path.join(out_dir, "engine_pb2.py")):
            return  # building from an sdist that already carries the stubs
        raise RuntimeError("engine.proto not found at %s" % proto)
    os.makedirs(out_dir, exist_ok=True)
    args = ["-I" + PROTO_DIR, "--python_out=" + out_dir, proto]
    try:
        from grpc_tools import protoc  # PyPI grpcio-tools, when present
        if protoc.main(["protoc"] + args) != 0:
            raise RuntimeError("grpc_tools.protoc failed")
    except ImportError:
        exe = shutil.which("protoc")
        if not exe:
            raise RuntimeError("need grpcio-tools or protoc (Debian: protobuf-compiler)")
        subprocess.check_call([exe] + args)


class BuildPy(build_py):
    """Generate the stubs into the build tree (not the source tree, so that
    a source checkout never carries stubs made by another protoc)."""

    def run(self):
        super().run()
        generate(os.path.join(self.build_lib, "engined_client", "_proto"))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "generate":
        generate(sys.argv[2])
    else:
        setup(cmdclass={"build_py": BuildPy})
