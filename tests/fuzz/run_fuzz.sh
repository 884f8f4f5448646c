#!/bin/sh
# run_fuzz.sh HARNESS WORK SECONDS [LIBFUZZER OPTIONS] — run one libFuzzer
# harness of tests/fuzz/ for SECONDS (FUZZ_SECONDS overrides it) over its
# seeds (corpus/NAME/ beside this script) and WORK/corpus, where new inputs
# go (kept for the next run; the source tree is never written). A crash,
# leak, timeout or sanitizer report leaves the input in WORK/artifacts/ and
# fails (non-zero exit). The harness's scratch files go to WORK/tmp, emptied
# before and after. dict/NAME.dict, when present, is the fuzzer's dictionary.
set -eu
harness="${1:?usage: run_fuzz.sh HARNESS WORK SECONDS [OPTIONS]}"
work="${2:?usage: run_fuzz.sh HARNESS WORK SECONDS [OPTIONS]}"
secs="${FUZZ_SECONDS:-${3:-20}}"
shift 3
here="$(cd "$(dirname "$0")" && pwd)"
name="$(basename "$harness")"
seeds="$here/corpus/$name"
[ -d "$seeds" ] || { echo "run_fuzz.sh: no seeds in $seeds"; exit 1; }
mkdir -p "$work/corpus" "$work/artifacts"
rm -rf "$work/tmp"
mkdir -p "$work/tmp"
set -- -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
	-artifact_prefix="$work/artifacts/" -print_final_stats=1 "$@"
[ -f "$here/dict/$name.dict" ] && set -- -dict="$here/dict/$name.dict" "$@"
# Outside `meson test` (whose sanitize setup sets them) the same options.
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
export TMPDIR="$work/tmp"
rc=0
"$harness" "$@" "$work/corpus" "$seeds" || rc=$?
rm -rf "$work/tmp"
exit "$rc"
