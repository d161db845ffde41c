"""`pgflow drop-flow` end to end in a subprocess: plan, refusals and their exit codes, confirmation,
dry run, export, per-table counts, JSON; run inputs and message bodies never on the terminal."""

from __future__ import annotations

import json
import os
import stat

from pgflow_cli.errors import ExitCode
from tests.dropflow.helpers import assert_gone, build_every_state
from tests.support.cli import run_cli

SECRET = "s3cr3t-input"


def _cli(db, *args: str, input: str | None = None):
    return run_cli("drop-flow", *args, "--dsn", db.conninfo, input=input)


def test_plan_refusal_and_forced_deletion(rt, db):
    build_every_state(rt, "Doomed")
    rt.start("Doomed", {"token": SECRET})

    dry = _cli(db, "Doomed", "--dry-run", "--format", "json")
    assert dry.code == ExitCode.FINDINGS, dry.output  # it would be refused: started runs, a live worker
    doc = json.loads(dry.stdout)
    assert (doc["kind"], doc["version"], doc["dry_run"], doc["result"]) == ("pgflow-cli/drop-flow", 2, True, None)
    assert doc["plan"]["verdict"] == "needs_force" and doc["plan"]["rows"]["runs"] == 5
    err = json.loads(dry.stderr)
    assert err["exit_code"] == 1 and "1 live worker(s) serve the flow" in err["detail"]

    refused = _cli(db, "Doomed", "--yes", "--confirm", "Doomed")
    assert refused.code == ExitCode.FINDINGS, refused.output
    assert "drop-flow plan for flow Doomed" in refused.stdout and "pgflow.step_tasks" in refused.stdout
    assert "error: flow 'Doomed' is still active; nothing was deleted" in refused.stderr
    assert rt.val("SELECT count(*) FROM pgflow.runs") == 5

    # the claiming worker is still alive: it beats, as a real one would every few seconds (on a busy
    # machine the commands above can outlast the 30 s liveness window since its last beat)
    rt.conn.execute("UPDATE pgflow.workers SET last_heartbeat_at = now() WHERE deprecated_at IS NULL "
                    "AND stopped_at IS NULL")
    done = _cli(db, "Doomed", "--force", "--yes", "--confirm", "Doomed")
    assert done.code == ExitCode.OK, done.output
    assert "deleted flow Doomed" in done.stdout
    assert "checked: nothing of flow 'Doomed' is left" in done.stdout
    assert "marked deprecated" in done.stdout and "worker functions left in place" in done.stdout
    assert SECRET not in done.output and SECRET not in refused.output and SECRET not in dry.output
    assert_gone(rt, "Doomed", ["doomed"])


def test_confirmation_rules_and_unknown_flows(rt, db):
    rt.flow("MyFlow", [{"slug": "a"}])
    assert _cli(db, "MyFlow").code == ExitCode.USAGE  # no terminal and no --yes
    assert _cli(db, "MyFlow", "--yes").code == ExitCode.USAGE  # --yes alone is not enough
    mismatch = _cli(db, "MyFlow", "--yes", "--confirm", "myflow")
    assert mismatch.code == ExitCode.USAGE and "does not match" in mismatch.stderr
    unknown = _cli(db, "myflow", "--yes", "--confirm", "myflow")
    assert unknown.code == ExitCode.CONFLICT, unknown.output
    assert 'flow "myflow" does not exist (flow "MyFlow" differs only in letter case' in unknown.stderr
    assert _cli(db, "nothing", "--dry-run").code == ExitCode.CONFLICT
    assert _cli(db, "MyFlow", "--format", "csv", "--dry-run").code == ExitCode.USAGE
    assert _cli(db, "MyFlow", "--dry-run", "--export", "/nonexistent/x").code == ExitCode.USAGE
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 1

    ok = _cli(db, "MyFlow", "--yes", "--confirm", "MyFlow", "--format", "json")
    assert ok.code == ExitCode.OK, ok.output
    doc = json.loads(ok.stdout)
    assert doc["result"]["verified"] is True and doc["result"]["leftovers"] == []
    assert doc["result"]["deleted"] == {"step_tasks": 0, "step_states": 0, "runs": 0, "deps": 0, "steps": 1,
                                        "flows": 1, "workers": 0}
    assert doc["result"]["queues"][0]["outcome"] == "dropped"


def test_export_writes_definition_and_history_first(rt, db, tmp_path):
    rt.flow("archived", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    run = rt.start("archived", {"token": SECRET})
    rt.poll("archived")
    rt.complete(run, "a", 0, {"out": "A"})
    target = tmp_path / "export"
    result = _cli(db, "archived", "--force", "--yes", "--confirm", "archived", "--export", str(target))
    assert result.code == ExitCode.OK, result.output
    assert SECRET not in result.output
    assert sorted(os.listdir(target)) == sorted(["definition.json", "runs.jsonl", "step_states.jsonl",
                                                 "step_tasks.jsonl", "manifest.json"])
    for name in os.listdir(target):
        assert stat.S_IMODE((target / name).stat().st_mode) == 0o600, name
    definition = json.loads((target / "definition.json").read_text())
    assert definition["flow"]["flow_slug"] == "archived"
    assert [s["step_slug"] for s in definition["steps"]] == ["a", "b"]
    assert definition["shape"]["steps"][1]["dependencies"] == ["a"]
    [exported_run] = [json.loads(line) for line in (target / "runs.jsonl").read_text().splitlines()]
    assert exported_run["run_id"] == str(run) and exported_run["input"] == {"token": SECRET}
    tasks = [json.loads(line) for line in (target / "step_tasks.jsonl").read_text().splitlines()]
    assert [(t["step_slug"], t["status"], t["output"]) for t in tasks] == [("a", "completed", {"out": "A"}), ("b", "queued", None)]
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["rows"] == {"runs": 1, "step_states": 2, "step_tasks": 2}
    assert_gone(rt, "archived", ["archived"])

    again = _cli(db, "archived", "--yes", "--confirm", "archived", "--export", str(target))
    assert again.code == ExitCode.USAGE and "not empty" in again.stderr  # checked before connecting


def _on_terminal(db, slug: str, typed: str):
    """Run drop-flow with a pseudo-terminal as stdin and type ``typed`` at the prompt."""
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
    proc = subprocess.Popen([sys.executable, "-m", "pgflow_cli", "drop-flow", slug, "--dsn", db.conninfo],
                            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    os.close(slave)
    os.write(master, (typed + "\n").encode())
    out, err = proc.communicate(timeout=120)
    os.close(master)
    return proc.returncode, out, err


def test_interactive_confirmation_by_typing_the_slug(rt, db):
    rt.flow("typed", [{"slug": "a"}])
    code, out, err = _on_terminal(db, "typed", "Typed")  # letter case matters
    assert code == ExitCode.INTERRUPTED, err
    assert "Type the flow slug to delete it" in err and "nothing was deleted" in err
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 1
    code, out, err = _on_terminal(db, "typed", "typed")
    assert code == ExitCode.OK, err
    assert "deleted flow typed" in out
    assert_gone(rt, "typed", ["typed"])
