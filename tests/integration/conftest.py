"""The operator fixture for every integration module (tests/integration/operator_helpers.py)."""

from tests.integration.operator_helpers import operator

__all__ = ["operator"]
