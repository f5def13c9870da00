#!/usr/bin/env bash
# Installs the project's vLLM plugin (trainer_image/grpo_weight_broadcast, packaged by
# trainer_image/vllm_plugin/pyproject.toml) with pip's real packaging into a directory of this checkout, and
# prints that directory. The local vLLM server (tests/harness/vllm_server.py) puts it on PYTHONPATH, where
# vLLM's plugin loader finds the distribution's entry point: the same package the generation image
# installs (trainer_image/Dockerfile.vllm). Per checkout, keyed by the sources, so the shared vLLM venv is
# never pointed at one checkout's files.
set -euo pipefail
cd "$(dirname "$0")/.."
KEY=$(cat trainer_image/vllm_plugin/pyproject.toml trainer_image/grpo_weight_broadcast/*.py | sha256sum | cut -c1-12)
TARGET="$PWD/.cache/vllm-plugin-$KEY"
mkdir -p .cache
# Test workers start vLLM servers at the same time: one installs, the others wait for it.
exec 9>.cache/vllm-plugin.lock
flock 9
if [ -f "$TARGET/.complete" ]; then
  echo "$TARGET"
  exit 0
fi
test -x .venv/bin/uv || { echo "hack/vllm-plugin.sh: run 'make venv' first (it installs uv)" >&2; exit 1; }
VLLM_PY=$(bash hack/vllm-env.sh)
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
cp trainer_image/vllm_plugin/pyproject.toml "$BUILD/"
mkdir "$BUILD/grpo_weight_broadcast"
cp trainer_image/grpo_weight_broadcast/*.py "$BUILD/grpo_weight_broadcast/"
rm -rf .cache/vllm-plugin-*
.venv/bin/uv pip install -q --python "$VLLM_PY" --cache-dir "${UV_CACHE:-$HOME/.cache/grpo-uv}" \
  --no-deps --target "$TARGET" "$BUILD" >&2
touch "$TARGET/.complete"
echo "$TARGET"
