"""The chart rendered once per module, for the tests that read the default install or the monitoring one."""

from __future__ import annotations

import pytest

from tests.helm.chart import MONITORING_APIS, VALUES_DIR, Doc, render


@pytest.fixture(scope="module")
def defaults() -> list[Doc]:
    return render()


@pytest.fixture(scope="module")
def monitoring() -> list[Doc]:
    return render([VALUES_DIR / "monitoring.yaml"], api_versions=MONITORING_APIS)
