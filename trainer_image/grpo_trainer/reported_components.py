"""The reward components a job reports (status, metrics.jsonl, Prometheus series): a bounded set of names."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger("grpo_trainer.progress")

# Reward components reported per job (status, metrics.jsonl, Prometheus series): the first names seen. A
# metric that invents new names each step must not grow the status object or the series without bound.
MAX_REPORTED_COMPONENTS = 16


@dataclass
class ComponentNames:
    """The reward components a job reports: the first MAX_REPORTED_COMPONENTS names seen, in that order."""

    names: list[str] = field(default_factory=list)
    warned: bool = False

    def reported(self, means: dict[str, float]) -> dict[str, float]:
        for name in means:
            if name not in self.names and len(self.names) < MAX_REPORTED_COMPONENTS:
                self.names.append(name)
        dropped = [name for name in means if name not in self.names]
        if dropped and not self.warned:
            self.warned = True
            log.warning(
                "the metric sent more than %d distinct reward component names; only the first are reported "
                "(%s), not %s",
                MAX_REPORTED_COMPONENTS,
                ", ".join(self.names),
                ", ".join(dropped[:5]),
            )
        return {name: means[name] for name in self.names if name in means}
