"""`pgflow task complete|fail` and `pgflow runs start` refuse what PostgreSQL cannot read (a NUL
escape, a lone surrogate, nesting deeper than the checked limit, bytes that are not UTF-8) with exit 2
and the path of the bad value, before anything is sent: the task and the run table stay as they were."""

from __future__ import annotations

import json

import pytest

from pgflow_cli import jsoncheck
from pgflow_cli.worker.flow import Flow
from tests.support.cli import run_cli

TOO_DEEP = "[" * (jsoncheck.MAX_DEPTH + 1) + "]" * (jsoncheck.MAX_DEPTH + 1)
FAR_TOO_DEEP = "[" * 200_000 + "]" * 200_000
"""Deeper than PostgreSQL's own parser reads with the default max_stack_depth."""
ARGUMENT_MAX = 128 * 1024
"""Linux's limit on one command-line argument: the far-too-deep value is given only as a file."""

ODD = [
    pytest.param('{"note": "a\\u0000b"}', "$.note", "NUL", id="nul-escape"),
    pytest.param('{"k\\u0000": 1}', '$["k\\u0000"]', "NUL", id="nul-in-key"),
    pytest.param('{"items": [1, "\\ud800"]}', "$.items[1]", "surrogate", id="lone-high-surrogate"),
    pytest.param('["ok", {"x": "\\udc00tail"}]', "$[1].x", "surrogate", id="lone-low-surrogate"),
    pytest.param(TOO_DEEP, "$[0][0]", "nested deeper", id="deeper-than-checked"),
    pytest.param(FAR_TOO_DEEP, "$[0][0]", "nested deeper", id="deeper-than-postgresql"),
    pytest.param('{"n": NaN}', "", "NaN", id="nan"),
]


@pytest.fixture
def waiting(rt, author):
    author(Flow("review").step("approve", manual=True).step("ship", lambda i, c: i, depends_on=["approve"]))
    return rt.start("review", {})


def _rows(rt, run_id) -> tuple:
    """Everything a completion or failure would change: the task, its step, the run, the next step's tasks."""
    conn = rt.conn
    return (conn.execute("SELECT * FROM pgflow.step_tasks WHERE run_id = %s ORDER BY step_slug, task_index",
                         (run_id,)).fetchall(),
            conn.execute("SELECT * FROM pgflow.step_states WHERE run_id = %s ORDER BY step_slug", (run_id,)).fetchall(),
            conn.execute("SELECT * FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchall())


@pytest.mark.parametrize(("text", "path", "reason"), ODD)
def test_task_complete_refuses_odd_json_with_its_path_and_leaves_the_task(db, rt, waiting, tmp_path, text, path, reason):
    before = _rows(rt, waiting)
    assert rt.task(waiting, "approve")["status"] == "started"
    document = tmp_path / "output.json"
    document.write_text(text, encoding="utf-8")
    results = [run_cli("task", "complete", str(waiting), "approve", "--output-file", str(document),
                       "--dsn", db.conninfo)]
    if len(text) < ARGUMENT_MAX:
        results.append(run_cli("task", "complete", str(waiting), "approve", "--output", text, "--dsn", db.conninfo))
    for result in results:
        assert result.code == 2, result.output
        assert reason in result.stderr and path in result.stderr, result.stderr
        assert "Traceback" not in result.output
    assert _rows(rt, waiting) == before


def test_task_complete_refuses_a_file_that_is_not_utf8(db, rt, waiting, tmp_path):
    before = _rows(rt, waiting)
    document = tmp_path / "latin1.json"
    document.write_bytes(b'{"name": "Ren\xe9"}')
    result = run_cli("task", "complete", str(waiting), "approve", "--output-file", str(document), "--dsn", db.conninfo)
    assert result.code == 2, result.output
    assert "not UTF-8" in result.stderr and "Traceback" not in result.output
    assert _rows(rt, waiting) == before


def test_task_fail_refuses_an_error_text_postgresql_cannot_store(db, rt, waiting):
    """Bytes that are not UTF-8 on the command line reach Python as lone surrogates."""
    import subprocess
    import sys

    from tests.support.cli import _clean_env

    before = _rows(rt, waiting)
    proc = subprocess.run([sys.executable, "-m", "pgflow_cli", "task", "fail", str(waiting), "approve",
                           "--error", b"rejected \xff".decode("utf-8", "surrogateescape"), "--dsn", db.conninfo],
                          capture_output=True, env={**_clean_env(), "LC_ALL": "C.UTF-8"})
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, stderr
    assert "--error" in stderr and "UTF-8" in stderr and "Traceback" not in stderr
    assert _rows(rt, waiting) == before


@pytest.mark.parametrize(("text", "path", "reason"), ODD)
def test_runs_start_refuses_odd_json_with_its_path_and_starts_nothing(db, rt, author, tmp_path, text, path, reason):
    author(Flow("plain").step("work", lambda i, c: i))
    count = "SELECT count(*) FROM pgflow.runs"
    before = rt.conn.execute(count).fetchone()
    document = tmp_path / "input.json"
    document.write_text(text, encoding="utf-8")
    sources = [["--input", f"@{document}"]] + ([["--input", text]] if len(text) < ARGUMENT_MAX else [])
    for source in sources:
        result = run_cli("runs", "start", "plain", *source, "--dsn", db.conninfo, "--format", "json")
        assert result.code == 2, result.output
        error = json.loads(result.stderr)
        assert reason in error["message"] and path in error["message"], error
        assert error["error"] in ("JsonValueError", "UsageError")
    assert rt.conn.execute(count).fetchone() == before


def test_any_option_with_bytes_that_are_not_utf8_is_a_usage_error(db, rt, waiting):
    """The generic guard: a slug given in Latin-1 is refused as usage (exit 2) naming its option, not a bug (70)."""
    import subprocess
    import sys

    from tests.support.cli import _clean_env

    before = _rows(rt, waiting)
    bad = b"revi\xe9w".decode("utf-8", "surrogateescape")
    proc = subprocess.run([sys.executable, "-m", "pgflow_cli", "task", "list", "--flow", bad, "--dsn", db.conninfo],
                          capture_output=True, env={**_clean_env(), "LC_ALL": "C.UTF-8"})
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, stderr
    assert "--flow" in stderr and "not UTF-8" in stderr and "Traceback" not in stderr
    assert _rows(rt, waiting) == before
