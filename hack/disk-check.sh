#!/usr/bin/env bash
# Stops a first install or build that would run out of disk half-way ("No space left on device" from pip
# or the Go linker, minutes in), and says instead what needs how much room, where, and how much is free.
# Callers name only what is not cached yet: with warm caches nothing is asked for and nothing is checked.
#
# Usage: hack/disk-check.sh PATH MB WHAT [PATH MB WHAT ...]
#   PATH  where it will be written (need not exist yet); MB  the room it takes; WHAT  what it is, with
#   _ for spaces (so that a caller can build the arguments with an unquoted $(...))
set -euo pipefail

# The nearest directory of PATH that exists: df tells the filesystem it will land on.
existing() {
  local p="$1"
  while [ ! -e "$p" ]; do p="$(dirname "$p")"; done
  printf '%s\n' "$p"
}

declare -A need=() names=()
while [ $# -ge 3 ]; do
  fs="$(df -P "$(existing "$1")" | awk 'NR == 2 {print $6}')"
  need[$fs]=$(( ${need[$fs]:-0} + $2 ))
  names[$fs]+="[disk]   ${3//_/ } in $1 (~$(( ($2 + 1023) / 1024 )) GB)"$'\n'
  shift 3
done
[ $# -eq 0 ] || { echo "usage: $0 PATH MB WHAT [PATH MB WHAT ...]" >&2; exit 2; }

short=0
for fs in "${!need[@]}"; do
  free_mb="$(df -Pm "$fs" | awk 'NR == 2 {print $4}')"
  if [ "$free_mb" -lt "${need[$fs]}" ]; then
    short=1
    {
      echo "[disk] not enough free disk on $fs: ${free_mb} MB free, about ${need[$fs]} MB needed for"
      printf '%s' "${names[$fs]}"
    } >&2
  fi
done
if [ "$short" -eq 1 ]; then
  {
    echo "[disk] Free some space (old clones, each with a .venv; a stopped cluster's files in"
    echo "[disk] ~/.cache/grpo-cluster; 'go clean -cache' once the binaries are built), or point HOME, or"
    echo "[disk] WHEELHOUSE, UV_CACHE and GRPO_TESTBINS, at a larger disk; then run the same command again:"
    echo "[disk] whatever finished is kept."
  } >&2
  exit 1
fi
