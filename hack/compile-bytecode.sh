#!/usr/bin/env bash
# Compiles every Python module of a venv (and any extra directories named) to bytecode, once: a marker file
# in the venv records it, and a venv without the marker is compiled, so venvs cached by an older checkout
# get compiled too.
#
# Why: where PYTHONDONTWRITEBYTECODE is set (this project's CI machines set it), Python never writes the
# .pyc files it compiles, and no installer here writes them either (uv does not by default), so every
# process compiled torch, transformers, TRL, vLLM and the rest from source at every start. Measured on
# 2 cores: `import grpo_trainer.trainer` took 36 s of CPU from source and 14 s from bytecode, and every
# trainer, vLLM server, operator and gateway process of the suite pays such an import. Python reads
# existing .pyc files whatever PYTHONDONTWRITEBYTECODE says.
#
# usage: hack/compile-bytecode.sh VENV [DIR...]
set -euo pipefail
VENV=$1
shift
MARKER="$VENV/.bytecode-compiled"
[ -f "$MARKER" ] && exit 0
exec 8>"$VENV/.bytecode.lock"
flock 8
[ -f "$MARKER" ] && exit 0
started=$(date +%s)
# A few files in wheels hold syntax for other Python versions (torch/testing/_internal/py312_intrinsics.py);
# they are never imported here and compileall reports them with exit status 1. Any other failure would
# only cost speed, never correctness, so the failures are counted and shown rather than fatal.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$VENV/bin/python" -m compileall -q -j 0 "$VENV/lib" "$@" >"$log" 2>&1 || true
failed=$(sed -n "s/^\*\*\* Error compiling //p" "$log")
echo "[bytecode] compiled $VENV${*:+ and $*} in $(($(date +%s) - started)) s;" \
  "did not compile: ${failed:-nothing}" | head -c 600 >&2
echo >&2
touch "$MARKER"
