#!/usr/bin/env bash
# The native lane's request reader under libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer
# (tests/fuzz/lane_request_fuzzer.cc): built with clang, run for FUZZ_SECONDS (default 60) from the kept corpus
# (tests/fuzz/corpus/lane_request); inputs it finds go to a temporary folder, so the kept corpus changes only by
# hand (copy a finding there with the fix that answers it). Exits non-zero on a crash or a sanitizer's report.
set -euo pipefail
cd "$(dirname "$0")/.."
compiler="${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}"
if [ -z "$compiler" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  packages=(clang-14 libclang-rt-14-dev)
  apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null; }
  compiler=clang++-14
fi
if [ -z "$compiler" ]; then
  echo "fuzz_native: clang is not installed (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$compiler" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  tests/fuzz/lane_request_fuzzer.cc -o "$work/lane_request_fuzzer"
mkdir "$work/found"
"$work/lane_request_fuzzer" -max_total_time="${FUZZ_SECONDS:-60}" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$work/" "$work/found" tests/fuzz/corpus/lane_request 2>&1 | tail -n 25
status=${PIPESTATUS[0]}
if ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* >/dev/null 2>&1; then
  echo "fuzz_native: the fuzzer found an input that fails (above)" >&2
  exit 1
fi
exit "$status"
