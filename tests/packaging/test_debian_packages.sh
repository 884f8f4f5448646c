#!/usr/bin/env bash
# tests/packaging/test_debian_packages.sh — the Debian packages, installed,
# run and purged on this machine (README "Packages"):
#  1. deploy/build-packages.sh builds them (lintian: no error or warning);
#  2. dpkg installs engined, enginectl and libengined-client-dev: their
#     files are where they belong, the engined user and its directories
#     exist with the modes of tmpfiles.d, systemd-analyze verify accepts
#     the installed engined@0.service;
#  3. the installed engined runs as user engined (setpriv, as the unit's
#     User=) with the packaged /etc/engined/0.conf, listening on a
#     kernel-chosen port instead of 50051 so that nothing else on the
#     machine is in its way; the
#     installed enginectl runs its demo against it (SFT, PPO, weights
#     streamed and checked against the saved checkpoint, reload); a C
#     program built with the -dev package (pkg-config engined-client) and
#     the wheel installed in a venv each read its status;
#  4. dpkg --purge removes every file the packages installed and
#     /etc/engined; only the data directory /var/lib/engined (and the
#     engined user: Debian does not remove system users) is left.
# Needs root (dpkg): exits 77 (skipped) without it. Refuses to run where
# any of the packages is installed already (an operator's install).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
pkgs=(engined enginectl libengined-client-dev)

if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: installing packages needs root"
  exit 77
fi
for p in "${pkgs[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "installed"; then
    echo "FAIL: package $p is installed on this machine already; not touching it" >&2
    exit 1
  fi
done

work=$(mktemp -d)
chmod 0711 "$work"   # the engined user writes its port file in $work/run
pid=
cleanup() {
  [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null || true
  dpkg --purge "${pkgs[@]}" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "build"
"$src/deploy/build-packages.sh" "$work/out" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "deploy/build-packages.sh"; }
debs=()
for p in "${pkgs[@]}"; do
  f=$(ls "$work/out/${p}"_*_amd64.deb 2>/dev/null | head -1)
  [ -n "$f" ] || fail "no package $p"
  debs+=("$f")
done
whl=$(ls "$work/out"/engined_client-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] || fail "no wheel"
if grep -E '^[EW]: ' "$work/out/lintian.txt"; then fail "lintian"; fi

step "install"
dpkg -i "${debs[@]}" >"$work/install.log" 2>&1 || { cat "$work/install.log" >&2; fail "dpkg -i"; }
for p in "${pkgs[@]}"; do
  dpkg-query -L "$p" >"$work/$p.files"
done
for f in /usr/bin/engined /usr/bin/enginectl /etc/engined/0.conf \
         /usr/lib/systemd/system/engined@.service /usr/lib/sysusers.d/engined.conf \
         /usr/lib/tmpfiles.d/engined.conf /usr/share/man/man8/engined.8.gz \
         /usr/share/man/man1/enginectl.1.gz /usr/share/doc/engined/README.md \
         /usr/include/engined_client.h /usr/include/engined/v1/engine.pb-c.h \
         /usr/lib/x86_64-linux-gnu/libengined-client.a \
         /usr/lib/x86_64-linux-gnu/pkgconfig/engined-client.pc; do
  [ -e "$f" ] || fail "installed: $f is missing"
done
dpkg-query -W -f='${Conffiles}\n' engined | grep -q "/etc/engined/0.conf" ||
  fail "/etc/engined/0.conf is not a conffile"
getent passwd engined >/dev/null || fail "no engined user"
[ "$(stat -c '%a %U %G' /etc/engined)" = "750 root engined" ] ||
  fail "/etc/engined: $(stat -c '%a %U %G' /etc/engined), want 750 root engined"
for d in /var/lib/engined /var/lib/engined/checkpoints /var/lib/engined/models; do
  [ "$(stat -c '%a %U' "$d")" = "750 engined" ] || fail "$d: $(stat -c '%a %U' "$d")"
done
/usr/bin/engined --version | grep -q "^engined " || fail "engined --version"
/usr/bin/engined --check-config /etc/engined/0.conf >/dev/null || fail "engined --check-config"
systemd-analyze verify --man=no /usr/lib/systemd/system/engined@0.service \
  >"$work/verify.log" 2>&1 || { cat "$work/verify.log" >&2; fail "systemd-analyze verify"; }

step "run the installed daemon as engined with /etc/engined/0.conf"
run=$(mktemp -d)
chown engined:engined "$run"
mv "$run" "$work/run"
setpriv --reuid=engined --regid=engined --init-groups /usr/bin/engined --config /etc/engined/0.conf \
  --listen 127.0.0.1:0 --port-file "$work/run/port" >"$work/engined.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  [ -s "$work/run/port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/engined.log" >&2; fail "engined exited"; }
  sleep 0.1
done
[ -s "$work/run/port" ] || { cat "$work/engined.log" >&2; fail "engined wrote no port file"; }
addr="127.0.0.1:$(head -1 "$work/run/port")"
/usr/bin/enginectl --addr "$addr" --no-progress demo \
  --checkpoint-root /var/lib/engined/checkpoints/0 >"$work/demo.log" 2>&1 ||
  { cat "$work/demo.log" "$work/engined.log" >&2; fail "enginectl demo"; }
grep -q "== demo OK" "$work/demo.log" || fail "demo did not say OK"

step "the C client from the -dev package"
cat >"$work/status.c" <<'EOF'
#include <stdio.h>
#include <engined_client.h>

int main(int argc, char **argv)
{
	struct ec_client *c = NULL;
	struct ec_status st = { 0 };
	Engined__V1__GetStatusResponse *r = NULL;

	if (argc != 2 || ec_connect(argv[1], &c, &st))
		return 2;
	if (ec_get_status(c, &r, &st)) {
		fprintf(stderr, "GetStatus: %s\n", st.message);
		return 1;
	}
	printf("initialized=%d\n", (int)r->initialized);
	ec_free(r);
	ec_close(c);
	return 0;
}
EOF
# shellcheck disable=SC2046
cc -o "$work/status" "$work/status.c" $(pkg-config --cflags --libs --static engined-client) \
  2>"$work/cc.log" || { cat "$work/cc.log" >&2; fail "building against libengined-client-dev"; }
"$work/status" "$addr" | grep -q "initialized=1" || fail "the C client's GetStatus"

step "the Python wheel"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --no-index --no-deps "$whl"
(cd "$work" && "$work/venv/bin/python" -c "
import sys, engined_client, engined_client._proto.engine_pb2
assert engined_client.__file__.startswith('$work/venv/'), engined_client.__file__
st = engined_client.EngineClient('$addr').get_status()
assert st.initialized, st
print('python client: initialized, step', st.step, 'version', st.version)
") || fail "the wheel's client"

kill -TERM "$pid"
wait "$pid" || fail "engined exited with status $? on SIGTERM"
pid=

step "purge"
dpkg --purge "${pkgs[@]}" >"$work/purge.log" 2>&1 || { cat "$work/purge.log" >&2; fail "dpkg --purge"; }
left=0
for p in "${pkgs[@]}"; do
  while read -r f; do
    if [ -e "$f" ] && [ ! -d "$f" ]; then echo "left after purge: $f" >&2; left=1; fi
  done <"$work/$p.files"
done
[ ! -e /etc/engined ] || { echo "left after purge: /etc/engined" >&2; left=1; }
[ "$left" = 0 ] || fail "files left after purge"
[ -d /var/lib/engined/checkpoints/0/demo ] || fail "purge removed the data directory"
rm -rf /var/lib/engined/checkpoints/0
echo "packages built, installed, run and purged"
