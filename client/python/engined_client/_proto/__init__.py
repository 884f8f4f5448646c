# Generated protobuf stubs of engine.proto live here (engine_pb2.py, made by
# setup.py at build time; not committed).
