"""The message classes of engine.proto: the package's own module (made by
setup.py when the package is built), else an engine_pb2 on sys.path (a
source tree run: meson makes one in build/client/python)."""
try:
    from ._proto import engine_pb2 as pb
except ImportError:  # running from a source tree with stubs on PYTHONPATH
    import engine_pb2 as pb  # type: ignore  # noqa: F401
