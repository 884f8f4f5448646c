# The messages of engine.proto live here (engine_pb2.py and engine.proto, put
# here by setup.py when the package is built; never in the source tree).
