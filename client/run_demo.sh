#!/bin/sh
# run_demo.sh [BUILD_DIR] — start engined on its embedded defaults
# (127.0.0.1:50051, ./var/checkpoints, ./var/models), run `enginectl demo`
# against it (tiny preset: SFT until the loss falls, forward-only log-probs,
# PPO steps, weight stream checked against a saved checkpoint, reload), then
# stop the daemon with SIGTERM. Exits with the demo's status.
set -u
build="${1:-build}"
"$build/daemon/engined" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null' INT TERM
i=0
until "$build/client/enginectl" status >/dev/null 2>&1; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! kill -0 $pid 2>/dev/null; then
		echo "run_demo: engined did not come up" >&2
		kill -TERM $pid 2>/dev/null
		exit 1
	fi
	sleep 0.1
done
"$build/client/enginectl" demo
rc=$?
kill -TERM $pid
wait $pid || rc=1
exit $rc
