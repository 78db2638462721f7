#!/usr/bin/env bash
# The native parts built a second way, with AddressSanitizer and UndefinedBehaviorSanitizer (setup.py's
# NATIVE_EDGE_SANITIZE=1), into a copy of the tree, and the native suites run against that build: the edge's,
# lanes' and JSON number arrays' own tests and their end-to-end tests with real servers and clients. Any sanitizer report fails the run.
# Arguments go to pytest. Needs the project's .venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
python="$root/.venv/bin/python"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -C "$root" --exclude=./.venv --exclude=./.git --exclude=./build --exclude='*.so' -cf - . | tar -C "$work" -xf -
cd "$work"
NATIVE_EDGE_SANITIZE=1 "$python" setup.py -q build_ext --inplace >build.log 2>&1 || { cat build.log; exit 1; }
ls runtime/grpc/_native_edge*.so runtime/native/_native_lanes*.so runtime/http/_json_numbers*.so >/dev/null
asan="$(gcc -print-file-name=libasan.so)"
ubsan="$(gcc -print-file-name=libubsan.so)"
# Python's own allocations are not leaks ASan can judge; a report of any other kind ends the process that made it.
# A small quarantine keeps memory near what it is without ASan (the suites bound some of it).
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:allocator_may_return_null=1:quarantine_size_mb=8"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export REQUIRE_NATIVE_GRPC_EDGE=1
status=0
LD_PRELOAD="$asan:$ubsan" "$python" -m pytest -p no:cacheprovider -q \
  tests/test_grpc_native.py tests/test_grpc_native_codec.py tests/test_worker_pickle.py tests/test_lane_request.py \
  tests/test_lanes.py tests/test_json_numbers.py tests/test_json_data.py tests/e2e/test_native_lanes.py tests/e2e/test_http_lanes.py \
  tests/e2e/test_lanes_refuse_as_the_core.py tests/e2e/test_grpc_compression.py tests/e2e/test_grpc_threads.py \
  "$@" || status=$?
# A server that a sanitizer stopped wrote its report to its log: fail on any, whatever the tests said.
if grep -rl -E "ERROR: AddressSanitizer|runtime error:" /tmp/pytest-of-"$(id -un)"/pytest-current/ 2>/dev/null; then
  echo "native_sanitized: a sanitizer reported an error (the logs above)" >&2
  status=1
fi
exit "$status"
