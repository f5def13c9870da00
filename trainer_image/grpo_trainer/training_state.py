"""How much training state this rank holds: parameters, gradients and optimizer state, in bytes.

Measured once, at the first optimizer step (gradients exist just before it, the optimizer's state just after
it), on the tensors this process really holds: under FSDP2 a parameter is a DTensor whose local shard is this
rank's part, so DDP (every rank holds everything) and FSDP (each holds about 1/world of it) can be compared
on the figure. Rank 0 writes it to metrics.jsonl as ``rank_state_bytes`` on the first step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _local(tensor: Any) -> Any:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _bytes(tensor: Any) -> int:
    local = _local(tensor)
    return int(local.numel() * local.element_size())


def parameter_and_gradient_bytes(model: Any) -> tuple[int, int]:
    parameters = gradients = 0
    for param in model.parameters():
        parameters += _bytes(param)
        if param.grad is not None:
            gradients += _bytes(param.grad)
    return parameters, gradients


def optimizer_state_bytes(optimizer: Any) -> int:
    total = 0
    for state in getattr(optimizer, "state", {}).values():
        for value in state.values():
            if hasattr(value, "numel") and value.dim() > 0:
                total += _bytes(value)
    return total


@dataclass
class TrainingState:
    """The first optimizer step's figures, filled in by the two hooks around it."""

    figures: dict[str, int] = field(default_factory=dict)
    reported: bool = False

    def before_first_step(self, model: Any) -> None:
        if model is not None and "parameters" not in self.figures:
            self.figures["parameters"], self.figures["gradients"] = parameter_and_gradient_bytes(model)

    def after_first_step(self, optimizer: Any) -> None:
        if optimizer is not None and "optimizer" not in self.figures and "parameters" in self.figures:
            self.figures["optimizer"] = optimizer_state_bytes(optimizer)

    def take(self) -> dict[str, int] | None:
        """The figures once, when complete (for the first step's record); None afterwards."""
        if self.reported or "optimizer" not in self.figures:
            return None
        self.reported = True
        return dict(self.figures)
