#!/usr/bin/env bash
# Creates .venv with the pinned requirements and the package installed in
# editable mode. Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.lingvo_pipe_installed
want="$(cat requirements.txt pyproject.toml | sha1sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . \
    || .venv/bin/python -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi
