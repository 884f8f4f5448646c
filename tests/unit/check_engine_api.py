#!/usr/bin/env python3
"""check_engine_api.py SRC_ROOT — what the engine library's users may include.

The daemon (daemon/), the C client and enginectl (client/) and the tools
(tools/) use the engine library through its public headers only: those in
engines/include/ (engine.h, the engine API; engine_dist.h, a group's id
and configuration; err.h, its error codes; checked.h and clock.h, checked
sizes and the clock; io/, the weights I/O library that the client links
too). The build hands them no other include directory; this check also
catches a path that reaches around it ("../engines/loss/loss.h"). A file
that includes any other header of engines/ (device/, dist/, loss/, model/,
native/, ...) fails the check, so that the engine's internals can change
without their users."""
import os
import re
import sys

USERS = ("daemon", "client", "tools")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def violations(root, texts):
    """texts: {path under root: source}. The includes of private engine
    headers, as messages."""
    out = []
    for f in sorted(texts):
        for inc in INCLUDE.findall(texts[f]):
            while inc.startswith("../"):
                inc = inc[3:]
            inc = inc[len("engines/"):] if inc.startswith("engines/") else inc
            if os.path.isfile(os.path.join(root, "engines", "include", inc)):
                continue  # public
            if not os.path.isfile(os.path.join(root, "engines", inc)):
                continue  # not an engine header (the user's own, or generated)
            out.append("%s includes engines/%s: a private header of the engine library "
                       "(public: engines/include/)" % (f, inc))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    texts = {}
    for user in USERS:
        for d, _, fs in os.walk(os.path.join(root, user)):
            for f in fs:
                if f.endswith((".c", ".h", ".cc")):
                    path = os.path.join(d, f)
                    texts[os.path.relpath(path, root)] = open(path, errors="replace").read()
    errors = violations(root, texts)
    planted = dict(texts, **{"daemon/planted.c": '#include "loss/loss.h"\n'})
    missed = len(violations(root, planted)) != len(errors) + 1
    for e in errors:
        print("FAIL " + e)
    if missed:
        print("FAIL the check did not find a planted include of loss/loss.h")
    print("%d files checked, %d private includes" % (len(texts), len(errors)))
    return 1 if errors or missed or len(texts) < 20 else 0


if __name__ == "__main__":
    sys.exit(main())
