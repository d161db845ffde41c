"""`pgflow prune` on the command line: confirmation, usage errors, schema levels, JSON, PgBouncer."""

from __future__ import annotations

import json

import pytest

from pgflow_cli.errors import ExitCode
from tests.prune.helpers import build_history
from tests.support.cli import run_cli
from tests.support.schemas import validate


def test_off_a_terminal_it_needs_yes_and_deletes_nothing_without_it(rt, db):
    history = build_history(rt)
    result = run_cli("prune", "--older-than", "30d", "--dsn", db.conninfo, input="")
    assert result.code == ExitCode.USAGE, result.output
    assert "--yes" in result.stderr and "--dry-run" in result.stderr
    assert rt.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY (%s)", (history.gone,)) == len(history.gone)


@pytest.mark.parametrize(("args", "message"), [
    (("--older-than", "soon"), "is not a duration"),
    (("--older-than", "30"), "at least 60 seconds"),
    (("--older-than", "1d", "--batch-size", "0"), "--batch-size must be 1 to 10,000"),
])
def test_bad_options_exit_2_before_connecting(args, message):
    result = run_cli("prune", *args, "--yes", "--dsn", "host=/nonexistent dbname=none")
    assert result.code == ExitCode.USAGE, result.output
    assert message in result.stderr and "Traceback" not in result.output


def test_yes_prunes_and_reports_json_that_matches_its_schema(rt, db):
    history = build_history(rt)
    dry = run_cli("prune", "--older-than", "30d", "--dry-run", "--dsn", db.conninfo, "--format", "json")
    assert dry.code == 0, dry.output
    dry_doc = json.loads(dry.stdout)
    validate(dry_doc, "prune")
    assert dry_doc["dry_run"] is True and dry_doc["deleted"]["runs"] == len(history.gone)
    assert rt.val("SELECT count(*) FROM pgflow.runs") == len(history.gone) + len(history.kept)

    result = run_cli("prune", "--older-than", "30d", "--yes", "--batch-size", "2", "--dsn", db.conninfo,
                     "--format", "json")
    assert result.code == 0, result.output
    doc = json.loads(result.stdout)
    validate(doc, "prune")
    assert (doc["dry_run"], doc["complete"], doc["older_than_seconds"], doc["batch_size"]) == (False, True, 2592000, 2)
    assert doc["deleted"]["runs"] == len(history.gone) and doc["deleted"]["runs_by_status"] == {"completed": 3, "failed": 1}
    assert rt.val("SELECT count(*) FROM pgflow.runs") == len(history.kept)


def test_the_table_says_what_went_and_what_stayed(rt, db):
    build_history(rt)
    result = run_cli("prune", "--older-than", "30d", "--yes", "--dsn", db.conninfo, "--format", "plain")
    assert result.code == 0, result.output
    assert "pgflow.runs (completed 3, failed 1)" in result.stdout and "deleted" in result.stdout
    assert "archive of queue orders" in result.stdout


def test_a_database_without_the_prune_batches_exits_3(baseline_db):
    result = run_cli("prune", "--older-than", "30d", "--yes", "--dsn", baseline_db.conninfo, "--format", "json")
    assert result.code == ExitCode.CONNECTION, result.output
    error = json.loads(result.stderr)
    assert error["reason"] == "schema_behind" and "prune" in error["message"]


def test_through_pgbouncer_in_transaction_mode(rt, db, pooled):
    history = build_history(rt)
    result = run_cli("prune", "--older-than", "30d", "--yes", "--batch-size", "1", "--dsn", pooled.conninfo,
                     "--format", "json")
    assert result.code == 0, result.output
    assert json.loads(result.stdout)["deleted"]["runs"] == len(history.gone)
    assert rt.val("SELECT count(*) FROM pgflow.runs") == len(history.kept)


def _on_terminal(db, typed: str) -> tuple[int, str, str]:
    """Run `pgflow prune --older-than 30d` with a pseudo-terminal as stdin and stderr, type ``typed`` at
    the prompt; returns the exit code, stdout and everything written to the terminal."""
    import os
    import pty
    import subprocess
    import sys
    import threading

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
    env.update(COLUMNS="200", TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "pgflow_cli", "prune", "--older-than", "30d", "--batch-size", "1",
                             "--dsn", db.conninfo], stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    screen = bytearray()
    prompted = threading.Event()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                return
            if not chunk:
                return
            screen.extend(chunk)
            if b"to prune" in screen and not prompted.is_set():
                prompted.set()
                os.write(master, (typed + "\n").encode())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out = proc.stdout.read().decode() if proc.stdout else ""
    code = proc.wait(timeout=120)
    reader.join(10)
    os.close(master)
    return code, out, screen.decode(errors="replace")


def test_on_a_terminal_it_counts_shows_progress_and_asks_for_the_duration_again(rt, db):
    history = build_history(rt)
    code, out, screen = _on_terminal(db, "30 days")
    assert code == ExitCode.INTERRUPTED, screen
    assert "would be deleted (dry run" in out and "pgflow.runs (completed 3, failed 1)" in out
    assert "runs scanned" in screen, screen  # the progress line
    assert "Type the duration (30d) to prune" in screen and "did not match" in screen
    assert rt.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY (%s)", (history.gone,)) == len(history.gone)
    code, out, screen = _on_terminal(db, "30d")
    assert code == ExitCode.OK, screen
    assert "deleted" in out and "pgflow.runs (completed 3, failed 1)" in out
    assert rt.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY (%s)", (history.gone,)) == 0
