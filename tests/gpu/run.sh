#!/usr/bin/env bash
# tests/gpu/run.sh — every check of the CUDA device on a GPU machine, in one
# go, within 8 minutes, ending with a summary.
#
# The GPU machines lent to this project run a CUDA image without the
# project's Debian packages (gRPC, oneDNN, jansson, ...), so the tests are
# built here and carried there as one archive:
#
#   tests/gpu/run.sh --pack            on a build machine (deploy/setup.sh --tests done):
#       configures build-gpu-pack (-Dcuda=enabled, -Dmarch=x86-64-v3 so the
#       binaries run on any recent x86 CPU), builds the GPU tests and the
#       benchmark only, and writes build-gpu-pack/gpu-bundle.tar.xz: the
#       binaries and the shared libraries they need beyond glibc (oneDNN,
#       jansson, xxhash, OpenCL loader; libstdc++/libgomp/libgcc_s as
#       fallbacks used only where the machine lacks them). ~15 MB.
#   tests/gpu/run.sh                   on the GPU machine:
#       unpacks build-gpu-pack/gpu-bundle.tar.xz (or $ENGINED_GPU_BUNDLE)
#       when present, else builds with meson into build-gpu (needs the
#       project's packages there), then runs, each under a time limit:
#         test_gpu_kernels  every kernel vs the CPU device, memory, errors
#         test_gpu_parity   CUDA vs CPU engine: log-probs, gradients, 30 steps
#         test_gpu_lora     LoRA adapters: CUDA vs CPU, step time vs full fine-tuning
#         test_gpu_offload  to(host) gives the memory back; training goes on
#         test_gpu_resume   determinism, checkpoint resume bit-identical
#         test_dist_nccl    the NCCL backend: a group of one, a missing rank
#         gpu_bench         Qwen2.5-0.5B and 1.5B: tokens/s and MFU
#       and prints a summary. Logs go to $ENGINED_GPU_OUT (default
#       ./gpu-results; under the device tool use $OUT to get them back).
#
# With the device tool (one call; pack first, here):
#   tests/gpu/run.sh --pack
#   run(command="tests/gpu/run.sh", carry=["build-gpu-pack/gpu-bundle.tar.xz"],
#       timeout_s=540)
#
# Exit status: 0 when every test passed (a skip counts as a failure here:
# this script is for machines with a GPU), 1 otherwise.
set -uo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
pack_dir=build-gpu-pack
bundle=${ENGINED_GPU_BUNDLE:-$pack_dir/gpu-bundle.tar.xz}
targets=(test_gpu_kernels test_gpu_parity test_gpu_lora test_gpu_offload test_gpu_resume test_dist_nccl gpu_bench)

# ---- packing (build machine) -------------------------------------------

if [ "${1:-}" = "--pack" ]; then
  set -e
  if [ ! -d "$pack_dir" ]; then
    meson setup "$pack_dir" -Dcuda=enabled -Dmarch=x86-64-v3 -Dbuildtype=release >/dev/null
  fi
  ninja -C "$pack_dir" "${targets[@]/#/tests/gpu/}"
  stage=$(mktemp -d)
  mkdir -p "$stage/gpu-bundle/bin" "$stage/gpu-bundle/lib" "$stage/gpu-bundle/lib-fallback"
  for t in "${targets[@]}"; do
    cp "$pack_dir/tests/gpu/$t" "$stage/gpu-bundle/bin/"
  done
  # Shared libraries beyond glibc, resolved on this machine.
  ldd "$stage"/gpu-bundle/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case "$name" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
      libstdc++.so.*|libgomp.so.*|libgcc_s.so.*)
        cp -L "$path" "$stage/gpu-bundle/lib-fallback/$name" ;;
      *) cp -L "$path" "$stage/gpu-bundle/lib/$name" ;;
    esac
  done
  git rev-parse HEAD > "$stage/gpu-bundle/COMMIT" 2>/dev/null || true
  git status --short > "$stage/gpu-bundle/STATUS" 2>/dev/null || true
  tar -C "$stage" -cJf "$bundle" gpu-bundle
  rm -rf "$stage"
  ls -la "$bundle"
  echo "carry $bundle to the GPU machine and run tests/gpu/run.sh there"
  exit 0
fi

# ---- running (GPU machine) ----------------------------------------------

start=$(date +%s)
deadline=$((start + 470))          # 8 minutes, with a margin for the summary
out=${ENGINED_GPU_OUT:-${OUT:-$root/gpu-results}}
mkdir -p "$out"

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -2
nproc

bindir=""
if [ -f "$bundle" ]; then
  work=$(mktemp -d)
  if tar -C "$work" -xJf "$bundle" 2>/dev/null ||
     python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
       "$bundle" "$work"; then
    bindir=$work/gpu-bundle/bin
    export LD_LIBRARY_PATH="$work/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if ldd "$bindir/gpu_bench" | grep -q "not found"; then
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$work/gpu-bundle/lib-fallback"
    fi
    echo "== bundle $(cat "$work/gpu-bundle/COMMIT" 2>/dev/null) ($(wc -l < "$work/gpu-bundle/STATUS" 2>/dev/null) uncommitted paths)"
  else
    echo "cannot unpack $bundle"
  fi
fi
if [ -z "$bindir" ]; then
  echo "== no bundle: building with meson into build-gpu"
  if { [ -d build-gpu ] || meson setup build-gpu -Dcuda=enabled >/dev/null; } &&
     ninja -C build-gpu "${targets[@]/#/tests/gpu/}" >"$out/build.log" 2>&1; then
    bindir=$root/build-gpu/tests/gpu
  else
    tail -30 "$out/build.log" 2>/dev/null
    echo "SUMMARY: build failed (see $out/build.log); pack on a build machine instead"
    exit 1
  fi
fi
echo "build/unpack: $(( $(date +%s) - start )) s"

# cuBLASLt is dlopen'ed by the CUDA device: make sure the loader finds it.
if ! ldconfig -p 2>/dev/null | grep -q "libcublasLt.so.13"; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           "$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)"; do
    if [ -n "$d" ] && [ -e "$d/libcublasLt.so.13" ]; then
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
      break
    fi
  done
fi
# libnccl too (engines/dist/nccl/ dlopens it).
if ! ldconfig -p 2>/dev/null | grep -q "libnccl.so.2"; then
  for d in /usr/local/cuda/lib64 \
           "$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + "/lib")' 2>/dev/null)"; do
    if [ -n "$d" ] && [ -e "$d/libnccl.so.2" ]; then
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
      break
    fi
  done
fi
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done

declare -A limit=([test_gpu_kernels]=90 [test_gpu_parity]=120 [test_gpu_lora]=60 [test_gpu_offload]=90
                  [test_gpu_resume]=90 [test_dist_nccl]=60 [gpu_bench]=240)
summary=()
failed=0
for t in "${targets[@]}"; do
  left=$((deadline - $(date +%s)))
  lim=${limit[$t]}
  [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -le 5 ]; then
    summary+=("$t: NOT RUN (out of time)")
    failed=1
    continue
  fi
  echo "== $t (limit ${lim}s)"
  t0=$(date +%s)
  timeout -k 5 "$lim" "$bindir/$t" 2>&1 | tee "$out/$t.log"
  rc=${PIPESTATUS[0]}
  dt=$(( $(date +%s) - t0 ))
  case $rc in
    0) status=PASS ;;
    77) status="SKIP (no GPU?)"; failed=1 ;;
    124) status="TIMEOUT after ${dt}s"; failed=1 ;;
    137) status="KILLED after ${dt}s (time limit or out of memory)"; failed=1 ;;
    *) status="FAIL (exit $rc)"; failed=1 ;;
  esac
  line="$t: $status, ${dt}s"
  if [ "$t" = gpu_bench ]; then
    while read -r j; do line+=$'\n    '"$j"; done < <(grep '^{' "$out/$t.log")
  else
    line+=" — $(grep -E "checks, [0-9]+ failed" "$out/$t.log" | tail -1)"
  fi
  summary+=("$line")
done

echo
echo "== SUMMARY ($(( $(date +%s) - start )) s)"
for s in "${summary[@]}"; do echo "  $s"; done
grep -h "^FAIL" "$out"/*.log 2>/dev/null | head -40
exit $failed
