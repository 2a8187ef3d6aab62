#!/usr/bin/env bash
# The whole test suite: pytest over tests/, then every Bazel test.
#   1. bash tools/setup.sh      creates or checks .venv
#   2. pytest tests             every *_test.py once: first all but the
#                               "serial" ones, two files at a time
#                               (pytest-xdist, one per core), then the
#                               serial ones alone (they start pinned worker
#                               servers or time overlap: tests/conftest.py);
#                               each phase lists its slowest tests
#   3. bash tools/bazel_test.sh bazel test //... (one process per test file,
#                               and checks the BUILD files' deps), except
#                               the tests tagged "integration" (trainer and
#                               worker processes) or "slow" (whole models,
#                               or over 15 s under Bazel): pytest ran them
#                               just now, Bazel still builds them, and
#                               bazel_build_test checks their deps (this
#                               saves running them twice: CONTRIBUTING.md
#                               gives the suite's time); run them under
#                               Bazel too with
#                               `bash tools/bazel_test.sh`.
#   --strict-timing             a timing test that skips under load fails
#                               instead (LINGVO_PIPE_STRICT_TIMING=1; for a
#                               release check on a quiet machine:
#                               CONTRIBUTING.md)
set -euo pipefail
cd "$(dirname "$0")/.."

for arg in "$@"; do
  case "$arg" in
    --strict-timing) export LINGVO_PIPE_STRICT_TIMING=1 ;;
    *) echo "tools/test.sh: unknown argument $arg (known: --strict-timing)" >&2
       exit 2 ;;
  esac
done

bash tools/setup.sh

# Runs pytest with the given arguments; fails on any failure, and on
# exit code 5 (no tests collected).
run_pytest() {
  local status=0
  .venv/bin/python -m pytest tests -q "$@" || status=$?
  if [ "$status" -eq 5 ]; then
    echo "tools/test.sh: FAILED: pytest $* collected no tests under tests/" \
      "(expected *_test.py files)" >&2
    exit 1
  elif [ "$status" -ne 0 ]; then
    echo "tools/test.sh: FAILED: pytest $* exited with $status" >&2
    exit "$status"
  fi
}

run_pytest -n 2 --dist loadfile -m "not serial" --durations=15
run_pytest -m serial --durations=5

bash tools/bazel_test.sh --test_tag_filters=-integration,-slow //...
