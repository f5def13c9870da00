"""Metric SDK: ``serve(metric_fn)`` turns ``def metric(example: dict, completion: str) -> float`` into a
server that speaks the GRPO metric protocol (docs/metric-contract.md)."""

from grpo_metric.protocol import FINISH_LENGTH, FINISH_STOP, ProtocolError, ScoreItem, ScoreResult
from grpo_metric.server import FormatFailure, MetricServer, make_app, serve

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "FormatFailure",
    "MetricServer",
    "ProtocolError",
    "ScoreItem",
    "ScoreResult",
    "make_app",
    "serve",
]
