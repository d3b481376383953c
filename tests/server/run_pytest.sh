#!/bin/sh
# CTest entry: runs one pytest file with the project's venv python (DSUF_PYTHON, set by `make test`).
py="${DSUF_PYTHON:-python3}"
if ! "$py" -c "import pytest, openai, tokenizers" 2>/dev/null; then
  echo "error: $py lacks pytest/openai/tokenizers; run through 'make test' or set DSUF_PYTHON to a python that has them" >&2
  exit 1
fi
exec "$py" -m pytest -q -p no:cacheprovider "$@"
