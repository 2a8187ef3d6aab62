#!/usr/bin/env bash
# Runs the Bazel tests offline: `bazel test //...` by default, or the
# targets given as arguments (e.g. //tests/core:nested_map_test).
#
# Uses Debian's Bazel 4.2.3 and installs it with apt-get when missing (CI
# runs as root on a fresh machine). Everything else Bazel needs is local:
# see WORKSPACE. Tests run with ./.venv/bin/python, so run
# `bash tools/setup.sh` first (tools/test.sh does). Options: .bazelrc.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v bazel >/dev/null || [ ! -d /usr/share/bazel/rules/java ]; then
  echo "tools/bazel_test.sh: installing bazel-bootstrap bazel-rules-java" >&2
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q bazel-bootstrap bazel-rules-java
fi

if [ ! -x .venv/bin/python ]; then
  echo "tools/bazel_test.sh: no .venv/bin/python; run bash tools/setup.sh" >&2
  exit 1
fi

flags=()
if [ "${CI:-}" = true ]; then
  flags=(--config=ci)
  # Nothing reuses the Bazel server after CI; free its memory.
  trap 'bazel shutdown' EXIT
fi
if [ $# -eq 0 ]; then
  set -- //...
fi
bazel test "${flags[@]}" "$@"
