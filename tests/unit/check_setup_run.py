#!/usr/bin/env python3
"""check_setup_run.py SOURCE_ROOT BUILD_DIR — the README's run command
(deploy/setup.sh without --tests) installs all that the product needs.

Every Debian package the built product uses must be in the dependency
closure of setup.sh's run packages (`deploy/setup.sh --list`: the
Build-Depends of deploy/debian/control and the Python client's), or
be part of a minimal Debian system (priority required or important):
  - the libraries engined and enginectl load (ldd);
  - the pkg-config files of the build's dependencies (meson introspect),
    except those meson.build asks for only with the tests
    (`required : get_option('tests')`);
  - oneDNN's header and the code generators the build runs (protoc-c,
    protoc);
  - the modules the Python client imports with Debian's python3.
A negative control runs the same check with one run package left out
(libuv1-dev: the daemon's loop) and must see it missing, so the check
cannot pass by seeing nothing.
"""
import json
import os
import re
import shutil
import subprocess
import sys


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def run_packages(root):
    """The run command's packages, as setup.sh itself lists them."""
    out = run(["bash", os.path.join(root, "deploy/setup.sh"), "--list"])
    if out.returncode or not out.stdout.split():
        sys.exit("check_setup_run: deploy/setup.sh --list failed: " + out.stderr)
    return out.stdout.split()


def closure(packages):
    out = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
               "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + packages)
    if out.returncode:
        sys.exit("check_setup_run: apt-cache depends failed: " + out.stderr)
    return {ln.strip("<>").split(":")[0] for ln in out.stdout.splitlines()
            if ln and not ln.startswith(" ")}


def base_system():
    out = run(["dpkg-query", "-W", "-f", "${Package} ${Priority}\n"])
    return {ln.split()[0] for ln in out.stdout.splitlines()
            if len(ln.split()) == 2 and ln.split()[1] in ("required", "important")}


def owners(paths):
    """{path: package} for each path dpkg knows (trying /usr <-> / too:
    a merged /usr shows one file under two names)."""
    found = {}
    alt = {p: (p[4:] if p.startswith("/usr/") else "/usr" + p) for p in paths}
    for second in (False, True):
        ask = [alt[p] if second else p for p in paths if p not in found]
        out = run(["dpkg", "-S"] + ask) if ask else None
        for ln in (out.stdout.splitlines() if out else []):
            pkgs, _, path = ln.partition(": ")
            for p in paths:
                if p not in found and path in (p, alt[p]):
                    found[p] = pkgs.split(",")[0].split(":")[0].strip()
    return found


def python_modules(imports, env):
    """The files of the modules Debian's python3 has loaded after `imports`."""
    out = run(["/usr/bin/python3", "-c", "import sys\n" + imports + "\n"
               "print('\\n'.join(getattr(m, '__file__', None) or '' for m in "
               "list(sys.modules.values())))"], env=env)
    if out.returncode:
        sys.exit("check_setup_run: python3 -c '%s' failed: %s" % (imports, out.stderr))
    return out.stdout


def used_files(root, build):
    """{what: path} of every file of a Debian package the product uses."""
    files = {}
    for exe in ("daemon/engined", "client/enginectl"):
        out = run(["ldd", os.path.join(build, exe)])
        for ln in out.stdout.splitlines():
            m = re.match(r"\s*(\S+) => (/\S+)", ln)
            if m:
                files["%s loads %s" % (exe, m.group(1))] = os.path.realpath(m.group(2))
    test_only = set(re.findall(r"dependency\('([^']+)',\s*required\s*:\s*get_option\('tests'\)",
                               open(os.path.join(root, "meson.build")).read()))
    deps = json.loads(run(["meson", "introspect", build, "--dependencies"]).stdout)
    for d in deps:
        name = d.get("name")
        if name in test_only:
            continue
        pcdir = run(["pkg-config", "--variable=pcfiledir", name]).stdout.strip()
        if pcdir:
            files["the build's dependency %s" % name] = os.path.join(pcdir, name + ".pc")
    files["the build's oneDNN header"] = "/usr/include/oneapi/dnnl/dnnl.h"
    for prog in ("protoc-c", "protoc"):
        path = shutil.which(prog)
        if not path:
            sys.exit("check_setup_run: %s not found" % prog)
        files["the build runs " + prog] = os.path.realpath(path)
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "client/python") + ":" +
               os.path.join(build, "client/python"))
    # What the interpreter loads before any import (site, this machine's
    # .pth files) is not the client's.
    startup = set(python_modules("", env).splitlines())
    for f in python_modules("import engined_client, engined_client.aio", env).splitlines():
        if f.startswith("/usr/") and f not in startup:
            files["the Python client imports " + f] = os.path.realpath(f)
    return files


def missing(files, owner, allowed):
    bad = []
    for what, path in sorted(files.items()):
        pkg = owner.get(path)
        if pkg is None:
            bad.append("%s: %s belongs to no Debian package" % (what, path))
        elif pkg not in allowed:
            bad.append("%s: %s is in package %s, which deploy/setup.sh's run packages "
                       "do not bring" % (what, path, pkg))
    return bad


def main():
    root, build = sys.argv[1], sys.argv[2]
    pkgs = run_packages(root)
    base = base_system()
    files = used_files(root, build)
    owner = owners(sorted(set(files.values())))
    run_closure = closure(pkgs)
    bad = missing(files, owner, run_closure | base)
    for b in bad:
        print(b)
    # Negative control: without libuv1-dev, libuv's .pc (and libuv1 unless
    # something else brings it) must show up as missing.
    if "libuv1-dev" not in pkgs:
        sys.exit("check_setup_run: the control package libuv1-dev is not a run package")
    control = missing(files, owner, closure([p for p in pkgs if p != "libuv1-dev"]) | base)
    if not any("libuv1-dev" in c for c in control):
        print("negative control: leaving out libuv1-dev was not seen")
        bad.append("control")
    print("%d files of %d packages checked against %d run packages (closure %d); "
          "%d problems" % (len(files), len(set(owner.values())), len(pkgs),
                           len(run_closure), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
