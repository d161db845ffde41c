"""Starting and reading runs with pgflow_cli.client: alone, inside the caller's transaction (never
committed or rolled back by the client), many at once, typed by the flow object or by slug."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import psycopg
import pytest

from pgflow_cli import client
from pgflow_cli.client import (
    Client,
    FlowNotFound,
    InvalidInput,
    JsonValueError,
    RawJson,
    RunNotFound,
    get_run,
    get_run_async,
    start_run,
    start_run_async,
    start_runs,
)
from pgflow_cli.errors import ExitCode, UsageError
from tests.client.flows import compile_flows, greet, held, mapper, skipper, strict


def _runs(conninfo: str, flow_slug: str) -> int:
    with psycopg.connect(conninfo) as other:
        return other.execute("SELECT count(*) FROM pgflow.runs WHERE flow_slug = %s", (flow_slug,)).fetchone()[0]


def test_importing_the_client_needs_none_of_the_command_lines_libraries():
    code = ("import sys, pgflow_cli.client, pgflow_cli.testing; "
            "print(sorted(m for m in ('typer', 'rich', 'tabulate', 'click') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_run_starts_alone_and_is_read_back_typed_by_the_flow(db):
    compile_flows(db.conninfo, greet)
    with Client(db.conninfo) as pgflow:
        run = pgflow.start(greet, {"first": "Ada", "last": "Lovelace"})
        assert (run.flow_slug, run.status, run.remaining_steps) == ("greetUser", "started", 2)
        assert _runs(db.conninfo, "greetUser") == 1  # committed: another connection sees it
        state = pgflow.get(run)
        by_slug = pgflow.get(run.run_id[:36])
    assert state == by_slug
    assert state.input == {"first": "Ada", "last": "Lovelace"}
    assert [s.step_slug for s in state.steps] == ["fullName", "greeting"]
    assert state.step("fullName").status == "started" and state.step("greeting").status == "created"
    with pytest.raises(KeyError):
        state.step("nope")  # type: ignore[arg-type]


def test_a_run_started_in_the_callers_transaction_commits_or_rolls_back_with_it(db):
    compile_flows(db.conninfo, greet)
    conn = db.connect()  # autocommit: the caller opens the transaction
    conn.execute("CREATE TABLE documents (id int PRIMARY KEY)")
    with conn.transaction():
        conn.execute("INSERT INTO documents VALUES (1)")
        run = start_run(conn, greet, {"first": "A", "last": "B"})
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # still the caller's
        assert _runs(db.conninfo, "greetUser") == 0  # not committed by the client
    assert _runs(db.conninfo, "greetUser") == 1
    with pytest.raises(RuntimeError), conn.transaction():
        conn.execute("INSERT INTO documents VALUES (2)")
        start_run(conn, "greetUser", {"first": "C", "last": "D"})
        raise RuntimeError("the application gives up")
    assert _runs(db.conninfo, "greetUser") == 1
    assert conn.execute("SELECT array_agg(id) FROM documents").fetchone()[0] == [1]
    assert get_run(conn, run).status == "started"


def test_on_a_non_autocommit_connection_the_client_leaves_the_commit_to_its_owner(db):
    compile_flows(db.conninfo, greet)
    conn = db.connect(autocommit=False)
    run = start_run(conn, greet, {"first": "A", "last": "B"})
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert _runs(db.conninfo, "greetUser") == 0
    conn.rollback()
    assert _runs(db.conninfo, "greetUser") == 0
    with pytest.raises(RunNotFound):
        get_run(conn, run)
    conn.rollback()
    conn.execute("CREATE TEMPORARY TABLE notes (n int)")
    conn.execute("INSERT INTO notes VALUES (1)")  # the caller's implicit transaction is open
    with pytest.raises(FlowNotFound):
        start_run(conn, "noSuchFlow", {})  # refused in a savepoint: the caller's work stands
    start_run(conn, greet, {"first": "A", "last": "B"})
    assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 1
    conn.commit()
    assert _runs(db.conninfo, "greetUser") == 1


def test_a_refused_start_leaves_the_callers_transaction_usable(db):
    compile_flows(db.conninfo, greet, mapper)
    conn = db.connect()
    conn.execute("CREATE TABLE documents (id int PRIMARY KEY)")
    with conn.transaction():
        conn.execute("INSERT INTO documents VALUES (1)")
        with pytest.raises(FlowNotFound) as unknown:
            start_run(conn, "noSuchFlow", {})
        with pytest.raises(InvalidInput) as not_array:
            start_run(conn, mapper, {"not": "an array"})
        conn.execute("INSERT INTO documents VALUES (2)")
        start_run(conn, mapper, [1, 2, 3])
    assert unknown.value.exit_code == ExitCode.CONFLICT and "noSuchFlow" in unknown.value.message
    assert not_array.value.exit_code == ExitCode.USAGE and "array" in not_array.value.message
    assert conn.execute("SELECT array_agg(id ORDER BY id) FROM documents").fetchone()[0] == [1, 2]
    assert _runs(db.conninfo, "mapper") == 1


def test_a_failed_transaction_is_refused_before_anything_is_sent(db):
    conn = db.connect(autocommit=False)
    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1 / 0")
    with pytest.raises(UsageError, match="roll it back"):
        start_run(conn, greet, {})


@pytest.mark.parametrize(("value", "path", "reason"), [
    ({"name": "a\x00b"}, "$.name", "NUL"),
    ({"items": [1, "\ud800"]}, "$.items[1]", "surrogate"),
    ({"ratio": float("nan")}, "$.ratio", "NaN"),
    ({"when": object()}, "$.when", "not a JSON value"),
    (RawJson('{"a": {"b c": "\\u0000"}}'), '$.a["b c"]', "NUL"),
    (RawJson('{"n": 1e200000}'), "$.n", "digits before the decimal point"),
    (RawJson("[" * 600 + "]" * 600), "$[0][0]", "nested deeper than 512"),
])
def test_an_input_jsonb_refuses_is_refused_with_its_path_and_nothing_is_sent(db, value, path, reason):
    compile_flows(db.conninfo, greet)
    conn = db.connect()
    with pytest.raises(JsonValueError) as refused:
        start_run(conn, greet, value)
    assert refused.value.exit_code == ExitCode.USAGE
    assert refused.value.path.startswith(path) and reason in refused.value.message
    assert _runs(db.conninfo, "greetUser") == 0


def test_what_the_checker_lets_through_postgresql_takes_as_it_was_written(db):
    """The checker must not refuse what jsonb takes: the largest numbers, escapes of real characters,
    512 levels, a surrogate pair. Sent as RawJson, the text reaches PostgreSQL unchanged (no float rounding)."""
    compile_flows(db.conninfo, greet)
    conn = db.connect()
    texts = ['{"n": 9e131071}', '{"n": 1e-16383}', '{"n": 0.1000000000000000000001}', '"\\ud83d\\ude00 \\u00e9"',
             "[" * 511 + "]" * 511, '{"\\u0001": "\\\\u0000 is text here"}']
    for text in texts:
        run = start_run(conn, greet, RawJson(text))
        stored = conn.execute("SELECT input = %s::jsonb FROM pgflow.runs WHERE run_id = %s", (text, run.run_id))
        assert stored.fetchone()[0] is True, text


def test_many_runs_start_in_one_statement_in_order_and_all_or_none(db):
    compile_flows(db.conninfo, greet, mapper)
    conn = db.connect()
    runs = start_runs(conn, greet, [{"first": str(i), "last": "x"} for i in range(5)])
    inputs = [get_run(conn, run).input["first"] for run in runs]
    assert inputs == ["0", "1", "2", "3", "4"]
    with pytest.raises(InvalidInput, match="element 1"):
        start_runs(conn, mapper, [[1], {"not": "array"}, [2]])
    assert _runs(db.conninfo, "mapper") == 0
    mixed = start_runs(conn, "mapper", [RawJson("[1, 2]"), [3]])
    assert [r.flow_slug for r in mixed] == ["mapper", "mapper"]
    with pytest.raises(JsonValueError, match=r"\$\[1\]\[0\]"):
        start_runs(conn, mapper, [[1], ["\x00"]])


def test_a_flow_that_settles_at_start_is_returned_ended(db):
    compile_flows(db.conninfo, strict, skipper)
    conn = db.connect()
    failed = start_run(conn, strict, {"go": False})
    done = start_run(conn, skipper, {"go": False})
    assert (failed.status, done.status, done.remaining_steps) == ("failed", "completed", 0)
    assert get_run(conn, done).step("gate").skip_reason == "condition_unmet"


def test_a_given_run_id_makes_a_retried_start_safe(db):
    compile_flows(db.conninfo, greet)
    conn = db.connect()
    run_id = uuid.uuid4()
    assert start_run(conn, greet, {}, run_id=run_id).run_id == str(run_id)
    with pytest.raises(psycopg.errors.UniqueViolation):
        start_run(conn, greet, {}, run_id=str(run_id))
    assert _runs(db.conninfo, "greetUser") == 1


def test_reading_an_unknown_run_is_run_not_found(db):
    conn = db.connect()
    with pytest.raises(RunNotFound) as missing:
        get_run(conn, uuid.uuid4())
    assert missing.value.exit_code == ExitCode.CONFLICT
    with pytest.raises(UsageError, match="not a run id"):
        get_run(conn, "nope")


def test_the_asyncio_variants_join_the_callers_transaction_the_same_way(db):
    compile_flows(db.conninfo, greet, held)

    async def scenario() -> tuple[str, str, int]:
        conn = await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True)
        async with conn:
            async with conn.transaction():
                run = await start_run_async(conn, greet, {"first": "A", "last": "B"})
                inside = _runs(db.conninfo, "greetUser")
            state = await get_run_async(conn, run)
            async with client.AsyncClient(db.conninfo) as pgflow:
                many = await pgflow.start_many(held, [{}, {}])
                again = await pgflow.get(many[1])
            return state.status, again.flow_slug, inside

    assert asyncio.run(scenario()) == ("started", "held", 0)
    assert _runs(db.conninfo, "greetUser") == 1 and _runs(db.conninfo, "held") == 2


def test_run_state_json_timestamps_with_any_fraction_are_read():
    """to_jsonb drops trailing zeros of the fraction (.5 instead of .500000); Python 3.10 reads only 3 or 6 digits."""
    from pgflow_cli.client.core import timestamp

    assert timestamp("2026-01-02T03:04:05.5+00:00").microsecond == 500000
    assert timestamp("2026-01-02T03:04:05.123+00:00").microsecond == 123000
    assert timestamp("2026-01-02T03:04:05+00:00").second == 5
