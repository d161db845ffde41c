"""Fixtures of the client tests: workers of test flows running in this process."""

from __future__ import annotations

import pytest

from pgflow_cli.worker import Worker, WorkerOptions
from tests.worker.helpers import FAST, stop_and_join


@pytest.fixture
def start_worker(db):
    """``start_worker(flow)``: a started reference worker of ``flow`` on the test database, stopped at the end."""
    started: list[Worker] = []

    def start(flow) -> Worker:
        worker = Worker(flow, db.conninfo, function_name=f"{flow.slug}-worker", options=WorkerOptions(**FAST))
        started.append(worker)
        worker.start()
        return worker

    yield start
    stop_and_join(started)
