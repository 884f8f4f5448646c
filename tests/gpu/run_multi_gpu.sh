#!/usr/bin/env bash
# tests/gpu/run_multi_gpu.sh — the data-parallel engine on N >= 2 GPUs of
# one machine (NCCL): one daemon per GPU plus one reference daemon on GPU 0,
# then tests/gpu/dp_multi_gpu.py (3 steps of SFT over the group against the
# reference on the whole batch). Needs the project's build (deploy/setup.sh
# with the CUDA device) and >= 2 GPUs; it cannot run on a one-GPU machine.
#   tests/gpu/run_multi_gpu.sh [N]        (default: every visible GPU)
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-$(nvidia-smi -L | wc -l)}
if [ "$n" -lt 2 ]; then
	echo "run_multi_gpu: needs at least 2 GPUs (found $n)" >&2
	exit 77
fi
tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"' EXIT
addrs=()
for i in $(seq 0 "$n"); do
	gpu=$(( i < n ? i : 0 ))   # the last one is the reference, on GPU 0
	CUDA_VISIBLE_DEVICES=$gpu build/daemon/engined --listen 127.0.0.1:0 \
		--port-file "$tmp/port$i" --checkpoint-root "$tmp/ck$i" \
		--model-root "$tmp/models" --dist-store-root "$tmp/dist" \
		-o engine.default_device=cuda > "$tmp/log$i" 2>&1 &
	pids+=($!)
done
for i in $(seq 0 "$n"); do
	for _ in $(seq 100); do [ -s "$tmp/port$i" ] && break; sleep 0.1; done
	addrs+=("127.0.0.1:$(head -1 "$tmp/port$i")")
done
PYTHONPATH=client/python:build/client/python python3 tests/gpu/dp_multi_gpu.py "${addrs[@]}"
