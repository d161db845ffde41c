"""`pgflow drop-flow --export` on an adopted pgflow 0.8.1 database whose finished runs have no stored
step outputs yet (the history backfill has not run): the step-state lines carry the outputs
`pgflow.get_run_with_states` computes from the tasks (the queue stage, 0003), not null, and are otherwise
the rows themselves; after the backfill the lines are the same."""

from __future__ import annotations

import json

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from pgflow_cli.upstream import adopt as adoption
from pgflow_cli.upstream import recognise as rec
from tests.support.cli import run_cli
from tests.upstream.history import OUTPUTS, finish_runs

FLOWS = {"orderFlow": ("single",), "fanOut": ("mapped", "empty")}


def _rows(conn: psycopg.Connection, flow: str) -> list[dict]:
    return [row[0] for row in conn.execute(
        "SELECT to_jsonb(ss) FROM pgflow.step_states AS ss WHERE ss.flow_slug = %s ORDER BY ss.run_id, ss.step_slug",
        (flow,))]


def _export(conninfo: str, flow: str, directory) -> list[dict]:
    result = run_cli("drop-flow", flow, "--force", "--yes", "--confirm", flow, "--export", str(directory),
                     "--dsn", conninfo)
    assert result.code == ExitCode.OK, result.output
    return [json.loads(line) for line in (directory / "step_states.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("history", ["pending", "backfilled"])
def test_exported_step_states_carry_the_computed_outputs(release_db, tmp_path, history):
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        runs = finish_runs(conn)
        adoption.adopt(conn, rec.recognise(conn), online="always")
        installer.apply(conn)
        stored_nulls = conn.execute("SELECT count(*) FROM pgflow.step_states WHERE status = 'completed' "
                                    "AND output IS NULL").fetchone()[0]
        assert stored_nulls == 9  # every step of the three finished runs: nothing stored yet
        if history == "backfilled":
            adoption.complete(conn, history=True)
        for flow, names in FLOWS.items():
            rows = _rows(conn, flow)
            lines = _export(release_db.conninfo, flow, tmp_path / flow)
            # the rows themselves, but for the outputs, which are what the tasks gave
            assert [{**line, "output": None} for line in lines] == [{**row, "output": None} for row in rows]
            by_run = {str(run): name for name, run in runs.items()}
            exported = {by_run[line["run_id"]]: {} for line in lines}
            for line in lines:
                exported[by_run[line["run_id"]]][line["step_slug"]] = line["output"]
            assert exported == {name: OUTPUTS[name] for name in names}
            assert conn.execute("SELECT count(*) FROM pgflow.runs WHERE flow_slug = %s", (flow,)).fetchone()[0] == 0
