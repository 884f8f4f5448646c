#!/usr/bin/env bash
# deploy/build-packages.sh [OUT_DIR] — the Debian packages and the Python
# wheel, built from this tree (README "Packages"), into OUT_DIR (default
# build/packages):
#   engined_VERSION_amd64.deb               the daemon, engined@.service,
#                                           sysusers.d/tmpfiles.d, /etc/engined/0.conf
#   enginectl_VERSION_amd64.deb             the command-line client
#   libengined-client-dev_VERSION_amd64.deb the C client: static library, headers, .pc
#   engined_client-VERSION-py3-none-any.whl the Python client, its messages inside
#   lintian.txt                             lintian's report on the .debs
# The tree is copied first (git's files, or everything but build*/), with
# deploy/debian as its debian/, so nothing is written into the source tree.
# Needs dpkg-dev, debhelper, help2man, lintian, python3-pip/-setuptools/
# -wheel and the build's packages (deploy/setup.sh --tests installs them).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$src/build/packages}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/engined" "$out"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) |
    tar -xf - -C "$work/engined"
else
  tar -C "$src" --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$work/engined"
fi
cp -r "$src/deploy/debian" "$work/engined/debian"

(cd "$work/engined" && dpkg-buildpackage -b -us -uc -j"$(nproc)" >"$work/build.log" 2>&1) || {
  tail -40 "$work/build.log" >&2
  echo "build-packages: dpkg-buildpackage failed" >&2
  exit 1
}
rm -f "$out"/*.deb "$out"/*.whl
mv "$work"/*.deb "$out"/
# lintian's tags of severity warning or error fail the build; the report
# (informational tags too) is kept beside the packages.
lintian --info --display-info "$out"/*.deb >"$out/lintian.txt" 2>&1 || true
if grep -E '^[EW]: ' "$out/lintian.txt" >&2; then
  echo "build-packages: lintian reports errors or warnings ($out/lintian.txt)" >&2
  exit 1
fi

# The wheel from the copy, with Debian's pip and setuptools and no network:
# setup.py generates the messages with protoc (grpcio-tools is not needed).
/usr/bin/python3 -m pip wheel --quiet --no-build-isolation --no-deps --no-index \
  -w "$out" "$work/engined/client/python"
ls -1 "$out"
