"""Runs that finished on a pgflow 0.8.1 database, made through the 0.8.1 functions: after an adoption
their completed steps have no stored output until the history backfill (docs/upgrade.md "The history
backfill (finished runs)"). Used by tests/upstream/test_history.py and test_drop_flow_export.py."""

from __future__ import annotations

import uuid

import psycopg

from tests.upgrade.conftest import BaselineDriver
from tests.upstream.conftest import FLOWS_081

OUTPUTS = {
    "single": {"validate": {"ok": True}, "charge": {"charged": 10}, "ship": {"parcel": "p1"}},
    "mapped": {"list": [1, 2, 3], "process": [10, 20, 30], "collect": 60},
    "empty": {"list": [], "process": [], "collect": 0},
}
"""The output of every step of each run of :func:`finish_runs`, as computed from its tasks (a map step:
its tasks' outputs in task_index order, ``[]`` for a map over nothing)."""


def finish_runs(conn: psycopg.Connection) -> dict[str, str]:
    """Define orderFlow and fanOut (FLOWS_081) and finish three runs with the 0.8.1 functions: a run of
    single steps (orderFlow), a map run over three items and a map run over nothing (fanOut).

    Returns:
        ``{"single": run_id, "mapped": run_id, "empty": run_id}``, all completed.
    """
    conn.execute(FLOWS_081)
    worker = uuid.uuid4()
    conn.execute("INSERT INTO pgflow.workers (worker_id, queue_name, function_name) VALUES (%s, 'orderFlow', "
                 "'legacy-worker')", (str(worker),))
    d = BaselineDriver(conn, worker)
    single = d.start("orderFlow", {"order": 1})
    for step, output in OUTPUTS["single"].items():
        d.finish("orderFlow", single, step, output)
    mapped = d.start("fanOut", {})
    d.finish("fanOut", mapped, "list", OUTPUTS["mapped"]["list"])
    for task in d.claim("fanOut", mapped, "process"):
        d.complete(task, task["input"] * 10)
    d.finish("fanOut", mapped, "collect", OUTPUTS["mapped"]["collect"])
    empty = d.start("fanOut", {})  # a map over an empty list completes with no task
    d.finish("fanOut", empty, "list", [])
    d.finish("fanOut", empty, "collect", 0)
    runs = {"single": single, "mapped": mapped, "empty": empty}
    assert conn.execute("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY(%s) AND status = 'completed'",
                        (list(runs.values()),)).fetchone()[0] == 3
    return runs
