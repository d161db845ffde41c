"""Issue 16 item 4: every ``--format json`` document is versioned, names the server connected to and
validates against its schema in docs/schemas/; CSV booleans are written as in JSON."""

from __future__ import annotations

import csv
import io
import json

import jsonschema
import pytest

from pgflow_cli.errors import ExitCode
from tests.output.helpers import seed
from tests.support.cli import run_cli
from tests.support.schemas import SCHEMAS, validate, validate_kind

COMMANDS = {
    "audit": (["audit"], {0, 1}),
    "migrate-status": (["migrate", "status"], {0}),
    "migrate-plan": (["migrate", "plan"], {0}),
    "migrate-apply": (["migrate", "apply"], {0}),
    "coverage": (["coverage"], {0, 1}),
    "fence-status": (["fence", "status"], {0}),
    "fence-disable": (["fence", "disable", "--function", "review-worker", "--dry-run", "-m", "schema test"], {0}),
    "fence-restore": (["fence", "restore", "--function", "review-worker", "--dry-run"], {0, 6}),
    "drop-flow": (["drop-flow", "review", "--dry-run", "--force"], {0}),
    "manual-tasks": (["task", "list"], {0}),
    "status": (["status"], {0}),
    "runs-list": (["runs", "list"], {0}),
    "runs-show": (["runs", "show", "{run_id}"], {0}),
    "workers-list": (["workers", "list"], {0}),
    "workers-forget": (["workers", "forget", "--stale-for", "1d", "--dry-run"], {0}),
    "prune": (["prune", "--older-than", "1d", "--dry-run"], {0}),
    "runs-start": (["runs", "start", "review"], {0}),
    "runs-wait": (["runs", "wait", "{run_id}", "--timeout", "0"], {5}),
    "runs-cancel": (["runs", "cancel", "{run_id}", "--yes"], {0}),
    "runs-retry": (["runs", "retry", "{cancelled_run_id}"], {0}),
    "runs-resume": (["runs", "resume", "{cancelled_run_id}"], {0}),
}
"""``{run_id}``: the seeded run of flow ``review``; ``{cancelled_run_id}``: that run, cancelled first."""


@pytest.fixture
def seeded(db):
    seed(db)
    return db


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_json_document_validates_against_its_schema(seeded, name):
    args, codes = COMMANDS[name]
    conn = seeded.connect()
    run_id = str(conn.execute("SELECT run_id FROM pgflow.runs WHERE flow_slug = 'review'").fetchone()[0])
    if any("{cancelled_run_id}" in arg for arg in args):
        conn.execute("SELECT pgflow.cancel_run(%s)", (run_id,))
    result = run_cli(*(arg.replace("{run_id}", run_id).replace("{cancelled_run_id}", run_id) for arg in args),
                     "--dsn", seeded.conninfo, "--format", "json")
    assert result.code in codes, result.output
    if result.code == ExitCode.CONFLICT:  # restore without a fence: the error document on stderr
        validate(json.loads(result.stderr), "error")
        return
    doc = json.loads(result.stdout)
    assert validate_kind(doc) == name
    assert (doc["kind"], type(doc["version"])) == (f"pgflow-cli/{name}", int)
    assert doc["database"]["dbname"] == seeded.name and doc["database"]["source"] == "--dsn"
    assert "never-printed" not in result.stdout


def test_every_schema_file_is_used_and_can_fail():
    names = {path.name.removesuffix(".schema.json") for path in SCHEMAS.glob("*.schema.json")}
    assert names - {"common", "error", "worker-log"} == set(COMMANDS)  # worker-log: tests/stage2/test_worker_stop.py
    for name in COMMANDS:
        with pytest.raises(jsonschema.ValidationError):
            validate({"kind": f"pgflow-cli/{name}", "version": 99, "tool_version": "x", "database": "a string"}, name)


def test_an_error_document_validates(db):
    result = run_cli("audit", "--dsn", db.conninfo, "--flow", "no_such_flow", "--format", "json")
    assert result.code == ExitCode.CONFLICT and result.stdout == ""
    validate(json.loads(result.stderr), "error")


def test_timestamps_are_utc_and_durations_seconds(seeded):
    doc = json.loads(run_cli("migrate", "status", "--dsn", seeded.conninfo, "--format", "json").stdout)
    applied = [m for m in doc["migrations"] if m["applied_at"]]
    assert applied and all(m["applied_at"].endswith("+00:00") for m in applied)
    assert all(m["duration_seconds"] == round(m["duration_ms"] / 1000, 3) for m in applied)


def test_csv_booleans_are_written_as_in_json(empty_db, baseline_db):
    result = run_cli("migrate", "plan", "--dsn", empty_db.conninfo, "--format", "csv")  # 0001-0003 pending
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert {row["preflight_audit"] for row in rows} == {"true", "false"}
    conn = baseline_db.connect()
    conn.execute("SELECT pgflow.create_flow('_hidden')")
    audit = list(csv.DictReader(io.StringIO(run_cli("audit", "--dsn", baseline_db.conninfo, "--format", "csv").stdout)))
    assert audit and {row["blocking"] for row in audit} <= {"true", "false"}
