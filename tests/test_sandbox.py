"""`pgflow sandbox` end to end: the README's first command on a private sandbox directory.

Every test stands alone: the module shares one sandbox server (initdb is the slow part), and the
``seeded`` fixture gives each test that needs it a freshly seeded demo database
(`sandbox reset --seed demo`), whatever earlier tests did to the server or its database.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from pgflow_cli.errors import ExitCode
from pgflow_cli.sandbox import STAGING_DATABASE, Sandbox
from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def sandbox_env():
    # Short, postgres-accessible path (the server runs as 'postgres' when we are root).
    base = tempfile.mkdtemp(prefix="pgflow-sbx-", dir="/tmp")
    os.chmod(base, 0o755)
    env = {"PGFLOW_SANDBOX_DIR": os.path.join(base, "sandbox")}
    yield env
    run_cli("sandbox", "reset", "--destroy", "--yes", env=env)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def seeded(sandbox_env):
    """A freshly seeded demo database in the running module sandbox; returns its status document."""
    reset = run_cli("sandbox", "reset", "--yes", "--seed", "demo", env=sandbox_env)
    assert reset.code == ExitCode.OK, reset.output
    status = run_cli("sandbox", "status", "--format", "json", env=sandbox_env)
    return json.loads(status.stdout)


def test_seeded_sandbox_audit_has_the_demo_findings(seeded, sandbox_env):
    audit = run_cli("audit", "--sandbox", "--format", "json", env=sandbox_env)
    assert audit.code == ExitCode.FINDINGS, audit.stderr
    doc = json.loads(audit.stdout)
    blocking = sorted((f["check_id"], f["object_name"]) for f in doc["findings"] if f["blocking"])
    assert blocking == [
        ("flow_slug_case_conflict", "Billing"),
        ("flow_slug_case_conflict", "billing"),
        ("flow_slug_rejected", "_legacyImport"),
        ("flow_slug_rejected", "report__daily"),
        ("queue_alias_conflict", "Billing"),
        ("queue_alias_conflict", "billing"),
        ("step_slug_case_conflict", "LoadData"),
        ("step_slug_case_conflict", "loadData"),
        ("step_slug_rejected", "render_"),
    ]
    impact = {f["flow_slug"]: f for f in doc["flows"]}
    assert impact["greetUser"]["active_runs"] == 3 and impact["greetUser"]["total_runs"] == 7
    assert impact["processOrder"]["started_tasks"] == 1  # claimed by the demo's vanished worker


def test_a_new_seeded_sandbox_reports_schema_and_seed(sandbox_env):
    env = {"PGFLOW_SANDBOX_DIR": sandbox_env["PGFLOW_SANDBOX_DIR"] + "-new"}
    try:
        up = run_cli("sandbox", "up", "--seed", "demo", env=env)
        assert up.code == ExitCode.OK, up.output
        assert "schema version: 0002" in up.stdout
        assert "loaded seed 'demo'" in up.stderr
    finally:
        run_cli("sandbox", "reset", "--destroy", "--yes", env=env)


def test_seed_states_and_idempotence(seeded, sandbox_env):
    assert seeded["running"] and seeded["flows"] == 7 and seeded["runs_in_flight"] == 10
    with psycopg.connect(seeded["conninfo"]) as conn:
        states = dict(conn.execute("SELECT status, count(*) FROM pgflow.runs GROUP BY status").fetchall())
    assert states == {"completed": 7, "failed": 2, "started": 10}
    again = run_cli("sandbox", "up", "--seed", "demo", env=sandbox_env)
    assert again.code == ExitCode.OK, again.output
    assert "kept the existing sandbox data; seed 'demo' not loaded" in again.stdout
    assert "pgflow sandbox up --seed demo --reset" in again.stdout


def test_seed_on_an_existing_sandbox_keeps_its_data_and_reset_seeds_again(seeded, sandbox_env):
    with psycopg.connect(seeded["conninfo"], autocommit=True) as conn:
        conn.execute("SELECT pgflow.start_flow('greetUser', '{\"user\": 99}'::jsonb)")
    kept = run_cli("sandbox", "up", "--seed", "demo", "--format", "json", env=sandbox_env)
    assert kept.code == ExitCode.OK, kept.output
    doc = json.loads(kept.stdout)
    assert doc["seed"]["loaded"] is False and "--reset" in doc["seed"]["note"]
    assert doc["runs_in_flight"] == 11  # the extra run is still there
    again = run_cli("sandbox", "up", "--seed", "demo", "--reset", "--format", "json", env=sandbox_env)
    assert again.code == ExitCode.OK, again.output
    doc = json.loads(again.stdout)
    assert doc["seed"] == {"name": "demo", "loaded": True, "note": None} and doc["runs_in_flight"] == 10
    assert "loaded seed 'demo'" in again.stderr


README = Path(__file__).resolve().parent.parent / "README.md"


def _readme_sandbox_commands() -> str:
    """The README one-liner after the install: `pgflow sandbox up --seed demo && pgflow audit --sandbox`."""
    line = next(line for line in README.read_text().splitlines() if line.startswith("python3 -m venv .venv && "))
    commands = line.split(" && ")[2:]
    assert commands and all(c.startswith(".venv/bin/pgflow ") for c in commands), line
    return " && ".join(c.replace(".venv/bin/pgflow ", "python3 -m pgflow_cli ", 1) for c in commands)


def _same_report(text: str) -> list[str]:
    """The lines that must not differ between two users: no paths, ports or ages."""
    return [re.sub(r"\b\d+(\.\d+)? (ms|s|min|h)\b", "<age>", line) for line in text.splitlines()
            if not any(k in line for k in ("directory", "port", "connection"))]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root to switch to another user")
def test_the_readme_one_liner_works_the_same_as_root_and_as_a_normal_user(sandbox_env):
    """As root (server run as 'postgres') and as 'nobody' (default directory under its home, server run as
    itself): the same seed, the same audit. The interpreter of this venv may live where 'nobody' cannot
    go (pyenv under /root), so 'nobody' runs the same package with the system python of the same version."""
    system_python = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("no system python of this version for the other user")
    commands = _readme_sandbox_commands()
    site = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_relative_to(sys.prefix))
    root_env = {**sandbox_env, "PGFLOW_SANDBOX_DIR": sandbox_env["PGFLOW_SANDBOX_DIR"] + "-readme"}
    home = tempfile.mkdtemp(prefix="pgflow-nobody-", dir="/tmp")
    os.chmod(home, 0o755)
    shutil.chown(home, "nobody", "nogroup")
    as_nobody = ["runuser", "-u", "nobody", "--", "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin",
                 f"PYTHONPATH={site}:{README.parent}", "COLUMNS=200"]
    try:
        root = subprocess.run(["bash", "-c", commands.replace("python3 ", f"{sys.executable} ")], capture_output=True,
                              text=True, timeout=300, env={**os.environ, **root_env, "COLUMNS": "200"})
        other = subprocess.run([*as_nobody, "bash", "-c", commands.replace("python3 ", f"{system_python} ")],
                               capture_output=True, text=True, timeout=300)
        assert root.returncode == other.returncode == ExitCode.FINDINGS, root.stderr + other.stderr
        assert f"{home}/.cache/pgflow-cli/sandbox" in other.stderr  # the documented non-root default
        assert _same_report(root.stdout) == _same_report(other.stdout)
    finally:
        subprocess.run([*as_nobody, system_python, "-m", "pgflow_cli", "sandbox", "down"], capture_output=True, timeout=60)
        run_cli("sandbox", "reset", "--destroy", "--yes", env=root_env)
        shutil.rmtree(home, ignore_errors=True)


def test_shell_completion_installs_and_completes(tmp_path):
    # typer finds the shell among the process's ancestors; run it from a bash that stays its
    # parent (the trailing `exit` stops bash from exec-ing the command), as an operator would.
    env = {**os.environ, "HOME": str(tmp_path), "SHELL": "/bin/bash"}
    installed = subprocess.run(["bash", "-c", f"{sys.executable} -m pgflow_cli --install-completion; exit $?"],
                               capture_output=True, text=True, timeout=60, env=env)
    assert installed.returncode == ExitCode.OK, installed.stdout + installed.stderr
    script = tmp_path / ".bash_completions" / "pgflow.sh"
    assert script.is_file() and str(script) in (tmp_path / ".bashrc").read_text()
    bindir = str(Path(sys.executable).parent)  # the pgflow console script of this install
    probe = f'source {script}; COMP_WORDS=(pgflow sta); COMP_CWORD=1; _pgflow_completion pgflow; echo "${{COMPREPLY[@]}}"'
    completed = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"]})
    assert "status" in completed.stdout.split(), completed.stdout + completed.stderr


def _runnable_left(conninfo: str) -> int:
    with psycopg.connect(conninfo) as conn:
        return conn.execute(
            "SELECT count(*) FROM pgflow.runs WHERE status = 'started' AND flow_slug IN ('greetUser', 'processOrder')"
        ).fetchone()[0]


def test_demo_workers_finish_the_runnable_runs(seeded, sandbox_env):
    with psycopg.connect(seeded["conninfo"], autocommit=True) as conn:
        # make the vanished worker's claim stale so recovery hands it back (as 90 s of waiting would)
        conn.execute("UPDATE pgflow.step_tasks SET queued_at = now() - interval '11 minutes', "
                     "started_at = now() - interval '10 minutes' WHERE status = 'started'")
    env = {k: v for k, v in os.environ.items() if not (k.startswith("PG") or k == "DATABASE_URL")}
    env.update(sandbox_env)
    proc = subprocess.Popen([sys.executable, "-m", "pgflow_cli", "sandbox", "worker"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _runnable_left(seeded["conninfo"]):  # wait for the state, not for a number of seconds
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the demo workers did not finish the runnable runs"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: drain and exit 0
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.OK, err


def test_dsn_and_down(sandbox_env):
    assert run_cli("sandbox", "up", env=sandbox_env).code == ExitCode.OK
    dsn = run_cli("sandbox", "dsn", env=sandbox_env)
    assert dsn.code == 0 and "dbname=pgflow" in dsn.stdout and "password" not in dsn.stdout
    down = run_cli("sandbox", "down", env=sandbox_env)
    assert down.code == 0
    assert run_cli("audit", "--sandbox", env=sandbox_env).code == ExitCode.CONNECTION
    assert run_cli("sandbox", "up", env=sandbox_env).code == ExitCode.OK  # restarts with its data


def test_unknown_seed_is_usage_error(sandbox_env):
    result = run_cli("sandbox", "up", "--seed", "nope", env=sandbox_env)
    assert result.code == ExitCode.USAGE and "unknown seed" in result.stderr


def test_reset_needs_confirmation_off_a_terminal(sandbox_env):
    result = run_cli("sandbox", "reset", env=sandbox_env)
    assert result.code == ExitCode.USAGE and "--yes" in result.stderr


BREAK_INSTALL = """
CREATE FUNCTION public.break_install() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = 'pgflow') THEN
    RAISE EXCEPTION 'installation broken on purpose by the test';
  END IF;
END $$;
CREATE EVENT TRIGGER break_install ON ddl_command_end EXECUTE FUNCTION public.break_install();
"""


def test_an_up_that_failed_half_way_is_repaired_by_the_next_up(sandbox_env):
    env = {"PGFLOW_SANDBOX_DIR": sandbox_env["PGFLOW_SANDBOX_DIR"] + "-broken"}
    sandbox = Sandbox(Path(env["PGFLOW_SANDBOX_DIR"]))
    try:
        sandbox.server.init()
        sandbox.server.start()
        # every new database is cloned from template1: this one fails in the middle of the install,
        # after the database exists and PGMQ and part of the schema went in
        with psycopg.connect(sandbox.server.conninfo("template1"), autocommit=True) as conn:
            conn.execute(BREAK_INSTALL)
        broken = run_cli("sandbox", "up", env=env)
        assert broken.code != ExitCode.OK
        assert "broken on purpose" in broken.stderr
        with psycopg.connect(sandbox.server.conninfo("template1"), autocommit=True) as conn:
            conn.execute("DROP EVENT TRIGGER break_install; DROP FUNCTION public.break_install()")

        repaired = run_cli("sandbox", "up", "--format", "json", env=env)
        assert repaired.code == ExitCode.OK, repaired.output
        status = json.loads(repaired.stdout)
        assert status["schema_version"] is not None and status["pending_migrations"] == 0, status
        assert status["pgmq_version"]
        with psycopg.connect(sandbox.server.conninfo("postgres")) as conn:
            names = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
        assert "pgflow" in names and STAGING_DATABASE not in names
        assert run_cli("audit", "--sandbox", env=env).code == ExitCode.OK
    finally:
        run_cli("sandbox", "reset", "--destroy", "--yes", env=env)


def test_the_sandbox_runs_in_local_mode(sandbox_env):
    """docs/architecture.md "Local vs production": a changed flow is recompiled in the sandbox, not refused."""
    reset = run_cli("sandbox", "reset", "--yes", env=sandbox_env)
    assert reset.code == ExitCode.OK, reset.output
    status = json.loads(run_cli("sandbox", "status", "--format", "json", env=sandbox_env).stdout)
    assert status["local_mode"] is True
    with psycopg.connect(status["conninfo"]) as conn:
        assert conn.execute("SELECT pgflow.is_local()").fetchone()[0] is True
    assert "mode: local" in run_cli("sandbox", "status", env=sandbox_env).stdout


def test_sandbox_dsn_imports_neither_psycopg_nor_rich_nor_pydantic(sandbox_env, tmp_path):
    """Issue 29 item 6: printing the connection string is cheap (bench/benchmarks/cli_startup.py measures it)."""
    from tests.support.cli import run_cli_imports

    assert run_cli("sandbox", "up", env=sandbox_env).code == ExitCode.OK
    result, modules = run_cli_imports("sandbox", "dsn", workdir=tmp_path, env=sandbox_env)
    assert result.code == ExitCode.OK and "dbname=pgflow" in result.stdout, result.output
    heavy = {name for name in modules if name.split(".")[0] in ("psycopg", "rich", "pydantic", "tabulate")}
    assert heavy == set()
