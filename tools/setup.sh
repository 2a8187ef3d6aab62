#!/usr/bin/env bash
# Creates .venv with the pinned requirements (runtime: requirements.txt;
# tests: requirements-test.txt) and the package installed in editable mode.
# Idempotent: a second run only checks what is there (a stamp of the
# requirement files and pyproject.toml; a changed file reinstalls).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.lingvo_pipe_installed
want="$(cat requirements.txt requirements-test.txt pyproject.toml \
  | sha1sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # One resolve: a test requirement (pytest, tensorboard) that conflicts
  # with a runtime pin fails the install instead of moving the pin.
  .venv/bin/python -m pip install -q -r requirements.txt \
    -r requirements-test.txt
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . \
    || .venv/bin/python -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi
