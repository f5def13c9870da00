"""The demo's closing lines about generation: what the job's vLLM server did (its own token counters from
/metrics, saved by the local runner when the server stopped) and what each weight sync cost and proved
(output/weight_syncs.jsonl on the job's volume).

Usage: python hack/demo_generation.py RUNNER_WORKDIR VOLUME_DIR
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

COUNTERS = {
    "vllm:prompt_tokens_total": "prompt tokens",
    "vllm:generation_tokens_total": "generated tokens",
    "vllm:request_success_total": "requests",
}


def counters(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_:]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if match and match.group(1) in COUNTERS:
            out[match.group(1)] = out.get(match.group(1), 0.0) + float(match.group(2))
    return out


def main(workdir: Path, volume: Path) -> int:
    for metrics in sorted(workdir.glob("*-gen-*.metrics")):
        found = counters(metrics.read_text(errors="replace"))
        figures = ", ".join(f"{found[k]:.0f} {label}" for k, label in COUNTERS.items() if k in found)
        print(f"vLLM pod {metrics.stem}: {figures or 'no counters'} (log: {metrics.with_suffix('.log')})")
    syncs_file = volume / "output" / "weight_syncs.jsonl"
    syncs = [json.loads(line) for line in syncs_file.read_text().splitlines()] if syncs_file.exists() else []
    if not syncs:
        print("no weight syncs recorded (the trainer generated in-process?)")
        return 0
    seconds = [float(s["seconds"]) for s in syncs]
    diffs = [float(s["logprob_diff"]) for s in syncs if "logprob_diff" in s]
    drifted = sum(1 for s in syncs if s.get("in_sync") is False)
    print(
        f"weight syncs ({syncs[0]['transport']}): {len(syncs)}, {sum(seconds) / len(seconds):.3f}s on average; "
        f"served vs trained log-probabilities after each: largest mean difference {max(diffs, default=0):.4f}, "
        f"{drifted} drifted"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
