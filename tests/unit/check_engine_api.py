#!/usr/bin/env python3
"""check_engine_api.py SRC_ROOT — what the engine library's users may include.

The daemon (daemon/), the C client and enginectl (client/) and the tools
(tools/) use the engine library through its public headers only: engine.h
(the engine API), err.h (its error codes), checked.h and clock.h (checked
sizes and the clock, shared by design), and the weights I/O library of
engines/io/ (a library of its own that the client links too). A file that
includes any other header of engines/ (device/, dist/, loss/, model/,
native/, ...) fails the check, so that the engines' internals can change
without their users."""
import os
import re
import sys

PUBLIC = {"engine.h", "err.h", "checked.h", "clock.h"}
PUBLIC_DIRS = ("io/",)
USERS = ("daemon", "client", "tools")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def violations(root, texts):
    """texts: {path under root: source}. The includes of private engine
    headers, as messages."""
    out = []
    for f in sorted(texts):
        for inc in INCLUDE.findall(texts[f]):
            inc = inc[3:] if inc.startswith("../") else inc
            if not os.path.isfile(os.path.join(root, "engines", inc)):
                continue  # not an engine header (the user's own, or generated)
            if inc in PUBLIC or inc.startswith(PUBLIC_DIRS):
                continue
            out.append("%s includes engines/%s: a private header of the engine library "
                       "(public: %s, io/)" % (f, inc, ", ".join(sorted(PUBLIC))))
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
