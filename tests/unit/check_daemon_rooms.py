#!/usr/bin/env python3
"""check_daemon_rooms.py SRC_ROOT [BUILD_DAEMON_DIR] — the daemon's layer
rules (docs/HACKING.md).

Every file under daemon/ sits in a layer; a file includes daemon headers of
lower layers only (its own header aside), so no file includes its caller and
no include circle can form. Only daemon/rpc/ includes gRPC's headers. A file
that is in no layer fails the check: place a new file in LAYERS.

With the build's daemon directory, the same rule on what the code does, not
only on what it includes: nm lists the global symbols each object file
defines and uses, and no file may use a symbol that a file of a higher
layer defines (a header of a low layer that declares a function defined
above would pass the include rule; this catches it)."""
import glob
import os
import re
import subprocess
import sys

# Header (or .c without a header) -> layer. A .c file takes its header's layer.
LAYERS = {
    # -1: the log, used everywhere
    "log.h": -1,
    # 0: leaves — each knows nothing of the rest of the daemon
    "config.h": 0, "presets.h": 0, "test_hold.h": 0, "auth.h": 0, "adapters.h": 0,
    "paths.h": 0, "omp_policy.h": 0, "fb_request.h": 0, "wire_check.h": 0, "rpc/rpc.h": 0, "rpc/tls.h": 0, "ops/metrics.h": 0,
    "export/params.h": 0, "export/share_table.h": 0,
    # 1: one RPC's lifecycle and the reply rules; the share socket (over the share table)
    "export/share_socket.h": 1,
    "job.h": 1,
    # 2: the ops services, handed what they need
    "ops/health.h": 2, "ops/reflection.h": 2, "replay.h": 2,
    # 3: the daemon's shared state; the running job's view of it; the
    # engine memory lent to gRPC
    "daemon.h": 3, "jobs.c": 3, "lent.c": 3,
    # 4: the TrainingEngine handlers; the weight exports
    "handlers.h": 4, "group.c": 4, "export/export.h": 4,
    # 5: the method table (names the handlers); an engine job's start and
    # end; 5.5: the batch of Sample calls (uses both)
    "methods.h": 5, "job_run.h": 5, "sample_batch.h": 5.5,
    # 6: the dispatcher and engine thread; 7: the lifecycle; 8: the program
    "dispatch.h": 6, "lifecycle.h": 7, "main.c": 8,
}
# A .c file whose header has another name.
OWN = {"rpc/rpc_grpc.c": "rpc/rpc.h", "group.c": "handlers.h", "sample.c": "handlers.h",
       "export/stream.c": "export/export.h", "export/share.c": "export/export.h",
       "jobs.c": "daemon.h", "lent.c": "daemon.h"}
GRPC_ROOM = "rpc/"
INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)


def layer_of(rel):
    if rel in LAYERS:
        return LAYERS[rel]
    own = OWN.get(rel, rel[:-2] + ".h" if rel.endswith(".c") else None)
    return LAYERS.get(own)


def check(texts):
    """texts: {path under daemon/: source}. Returns the violations."""
    by_base = {}
    for f in sorted(texts):
        if f.endswith(".h"):
            by_base.setdefault(os.path.basename(f), f)
    errors = []
    for f in sorted(texts):
        lf = layer_of(f)
        if lf is None:
            errors.append("%s: in no layer (add it to LAYERS in %s)" % (f, __file__))
            continue
        own = OWN.get(f, f[:-2] + ".h" if f.endswith(".c") else f)
        for kind, inc in INCLUDE.findall(texts[f]):
            if kind == "<" and inc.startswith("grpc/") and not f.startswith(GRPC_ROOM):
                errors.append("%s: includes <%s>: only daemon/rpc/ may use gRPC" % (f, inc))
            if kind != '"' or inc not in by_base:
                continue
            target = by_base[inc]
            lt = layer_of(target)
            if target == own or lt is None:
                continue  # a file in no layer is reported on its own
            if lt >= lf:
                errors.append("%s (layer %d) includes %s (layer %d): only lower layers"
                              % (f, lf, target, lt))
    return errors


def check_symbols(defs, uses):
    """defs: {symbol: file that defines it}; uses: {file: symbols it uses}.
    Returns the calls that go up a layer."""
    errors = []
    for f in sorted(uses):
        lf = layer_of(f)
        for sym in sorted(uses[f]):
            target = defs.get(sym)
            if target is None or target == f:
                continue
            lt = layer_of(target)
            if lf is not None and lt is not None and lt > lf:
                errors.append("%s (layer %d) uses %s, defined in %s (layer %d): only lower "
                              "layers or its own" % (f, lf, sym, target, lt))
    return errors


def object_symbols(build_dir, sources):
    """nm over the daemon's object files: ({symbol: file}, {file: symbols
    used}), files named as under daemon/ (meson names an object after its
    source path with '/' as '_')."""
    by_object = {s.replace("/", "_") + ".o": s for s in sources if s.endswith(".c")}
    defs, uses = {}, {}
    for obj in glob.glob(os.path.join(build_dir, "*.p", "*.o")):
        src = by_object.get(os.path.basename(obj))
        if src is None:
            continue  # generated code
        out = subprocess.run(["nm", "-P", obj], check=True, capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            sym, kind = parts[0], parts[1]
            if kind == "U":
                uses.setdefault(src, set()).add(sym)
            elif kind in "TDBRCGS":
                defs[sym] = src
    return defs, uses


def main():
    root = os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "daemon")
    texts = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith((".c", ".h")):
                path = os.path.join(d, f)
                texts[os.path.relpath(path, root)] = open(path).read()
    # The check must catch what it is for: a caller included by a callee,
    # gRPC outside rpc/, an unplaced file.
    planted = dict(texts)
    planted["job.h"] = planted["job.h"] + '\n#include "daemon.h"\n'
    planted["ops/health.c"] = planted["ops/health.c"] + "\n#include <grpc/grpc.h>\n"
    planted["stray.c"] = ""
    missed = len(check(planted)) - len(check(texts)) != 3
    errors = check(texts)
    objects = 0
    if len(sys.argv) > 2:
        defs, uses = object_symbols(sys.argv[2], texts)
        objects = len(uses)
        errors += check_symbols(defs, uses)
        # A use of a higher layer's symbol must be found: handlers.c
        # calling the dispatcher's on_call-level code, for instance.
        planted_uses = {f: set(s) for f, s in uses.items()}
        planted_uses.setdefault("job.c", set()).add("__planted_symbol")
        planted_defs = dict(defs, __planted_symbol="dispatch.c")
        if len(check_symbols(planted_defs, planted_uses)) != len(check_symbols(defs, uses)) + 1:
            missed = True
        if objects < 20:
            print("FAIL only %d object files found under %s" % (objects, sys.argv[2]))
            missed = True
    for e in errors:
        print("FAIL " + e)
    if missed:
        print("FAIL the check did not find the planted violations")
    print("%d files checked, %d object files, %d violations"
          % (len(texts), objects, len(errors)))
    return 1 if errors or missed or not texts else 0


if __name__ == "__main__":
    sys.exit(main())
