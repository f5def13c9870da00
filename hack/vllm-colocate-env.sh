#!/usr/bin/env bash
# Makes a venv that holds both vLLM's CPU build and the trainer, outside the repository, and prints its
# python. The local cluster starts a trainer pod whose generation backend is vllm-colocate (the vLLM engine
# inside the training process) with it, standing in for a trainer image that carries vLLM
# (tests/harness/local_runner.py); the other trainer pods keep the project's .venv, which has no vLLM
# (TRL imports vllm eagerly when it is installed: 30-50 s more per trainer process).
# A thin overlay: a venv whose .pth file puts the vLLM CPU venv's site-packages (hack/vllm-env.sh) behind its
# own, and which holds only what that venv lacks, pinned in hack/vllm-colocate-overlay.txt and installed
# --no-deps. The repository's packages are not in it: the caller puts operator/ and trainer_image/ on
# PYTHONPATH (one venv serves every checkout). Keyed by the vLLM lock and the overlay's pins; resumable:
# an install that died half-way is redone, a complete one (.complete) is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${GRPO_VLLM_HOME:-$HOME/.cache/grpo-vllm}"
VLLM_PYTHON=$(bash hack/vllm-env.sh)
KEY=$(cat hack/vllm-cpu-lock.txt hack/vllm-colocate-overlay.txt | sha256sum | cut -c1-12)
VENV="$ROOT/colocate-$KEY"
UV_CACHE="${UV_CACHE:-$HOME/.cache/grpo-uv}"
if [ -f "$VENV/.complete" ]; then
  bash hack/compile-bytecode.sh "$VENV" >&2
  echo "$VENV/bin/python"
  exit 0
fi
test -x .venv/bin/uv || { echo "hack/vllm-colocate-env.sh: run 'make venv' first (it installs uv)" >&2; exit 1; }
echo "[vllm-colocate-env] installing hack/vllm-colocate-overlay.txt over $(dirname "$(dirname "$VLLM_PYTHON")") into $VENV (once; ~100 MB, under a minute)" >&2
rm -rf "$VENV"
.venv/bin/uv venv -q --python "$(command -v python3.11)" "$VENV" >&2
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
VLLM_SITE=$("$VLLM_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# After the overlay's own site-packages on sys.path: the overlay adds packages, it replaces none of vLLM's.
echo "$VLLM_SITE" > "$SITE/grpo-vllm-cpu.pth"
.venv/bin/uv pip install -q --python "$VENV/bin/python" --cache-dir "$UV_CACHE" --link-mode hardlink \
  --no-deps -r hack/vllm-colocate-overlay.txt >&2
"$VENV/bin/python" -c 'import importlib.metadata as m; m.version("trl"); m.version("vllm-cpu")' >&2
bash hack/compile-bytecode.sh "$VENV" >&2
touch "$VENV/.complete"
echo "$VENV/bin/python"
