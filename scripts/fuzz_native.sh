#!/usr/bin/env bash
# The native lane's request reader (tests/fuzz/lane_request_fuzzer.cc) and the JSON number arrays
# (tests/fuzz/json_numbers_fuzzer.cc) under libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer: built with
# clang, run for FUZZ_SECONDS in all (default 60: two thirds, one third) from the kept corpora (tests/fuzz/corpus/);
# inputs they find go to a temporary folder, so the kept corpora change only by hand (copy a finding there with the
# fix that answers it). Exits non-zero on a crash or a sanitizer's report.
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
seconds="${FUZZ_SECONDS:-60}"
status=0
for target in lane_request:$((seconds * 2 / 3)) json_numbers:$((seconds - seconds * 2 / 3)); do
  name="${target%%:*}"
  "$compiler" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
    "tests/fuzz/${name}_fuzzer.cc" -o "$work/${name}_fuzzer"
  mkdir "$work/found-$name"
  "$work/${name}_fuzzer" -max_total_time="${target##*:}" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/" "$work/found-$name" "tests/fuzz/corpus/$name" 2>&1 | tail -n 25
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
if ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* >/dev/null 2>&1; then
  echo "fuzz_native: the fuzzer found an input that fails (above)" >&2
  exit 1
fi
exit "$status"
