"""Shared fixtures: a private partition cache and a Flower task identity for building Messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Keep partition caches of the test run out of ~/.cache."""
    os.environ["HETFL_CACHE"] = str(tmp_path_factory.mktemp("hetfl-cache"))
    yield


@pytest.fixture
def task_identity():
    """Flower 1.41 Messages need a run/node identity in the creating process."""
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = old


def require_fmnist() -> None:
    """FMNIST tests need the Debian package; `make test` installs it (fail loudly, never skip)."""
    if not (FMNIST_DIR / "train-images-idx3-ubyte.gz").exists():
        pytest.fail("Fashion-MNIST missing: apt-get install -y dataset-fashion-mnist (make data)")
