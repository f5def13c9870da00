"""The chart rendered once per module, for the tests that read the default install or the monitoring one; its
denying admission policies installed once per module, for the tests that judge objects against them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.kube import Cluster
from tests.helm.admission import Installed, install_policies
from tests.helm.chart import MONITORING_APIS, VALUES_DIR, Doc, render


@pytest.fixture(scope="module")
def defaults() -> list[Doc]:
    return render()


@pytest.fixture(scope="module")
def monitoring() -> list[Doc]:
    return render([VALUES_DIR / "monitoring.yaml"], api_versions=MONITORING_APIS)


# Per module, not per session: the tests create GPU pods in the policies' namespace, and only deleting it at
# the module's end gives those GPUs back to the rest of the session (an 8-GPU pod needs a whole node free).
@pytest.fixture(scope="module")
def installed(kube: Cluster) -> Iterator[Installed]:
    yield from install_policies(kube)
