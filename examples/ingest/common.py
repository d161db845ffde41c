"""Command-line plumbing shared by both versions: arguments, the database, waiting for outcomes.

Not orchestration: both versions keep it unchanged.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from examples.ingest import domain

REPO = Path(__file__).resolve().parents[2]


def parser(prog: str, description: str) -> tuple[argparse.ArgumentParser, Any]:
    """The parser and its subcommands: ``run`` with ``--sandbox | --dsn``, ``--documents``,
    ``--workers-per-step``, ``--timeout`` (a version may add more subcommands)."""
    top = argparse.ArgumentParser(prog=prog, description=description)
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="set up, start one worker pool per stage, ingest, wait, report")
    where = run.add_mutually_exclusive_group(required=True)
    where.add_argument("--sandbox", action="store_true", help="use the `pgflow sandbox up` database")
    where.add_argument("--dsn", help="libpq conninfo of a database with pgflow and PGMQ installed")
    run.add_argument("--documents", type=int, default=50, help="documents to ingest (every 10th is missing)")
    run.add_argument("--workers-per-step", type=int, default=1, help="worker processes per stage")
    run.add_argument("--timeout", type=float, default=300, help="seconds to wait for terminal outcomes")
    return top, commands


def resolve_dsn(args: argparse.Namespace) -> str:
    """The conninfo from ``--dsn`` or the running sandbox (exit 3 with a hint when it is down)."""
    if args.dsn:
        return str(args.dsn)
    from pgflow_cli.errors import PgflowError
    from pgflow_cli.sandbox import Sandbox

    try:
        return Sandbox.default().running_conninfo()
    except PgflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(3) from None


def child_env(dsn: str) -> dict[str, str]:
    """Environment of worker processes: the repository importable, ``INGEST_DSN`` set."""
    env = dict(os.environ, INGEST_DSN=dsn, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def spawn(argv: list[str], dsn: str) -> subprocess.Popen[str]:
    """Start one worker process (its output goes to this process's stderr)."""
    return subprocess.Popen([sys.executable, *argv], env=child_env(dsn), cwd=str(REPO), text=True,
                            stdout=sys.stderr, stderr=sys.stderr)


def wait_terminal(dsn: str, timeout: float, each_tick: Callable[[psycopg.Connection], object] | None = None) -> bool:
    """Poll until every document is ``done`` or ``failed``; ``each_tick(conn)`` runs first each time."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if each_tick:
                each_tick(conn)
            if domain.pending_count(conn) == 0:
                return True
            time.sleep(0.2)
    return False


def stop(processes: list[subprocess.Popen[str]]) -> None:
    """SIGTERM every worker process and wait for each (they drain in-flight work)."""
    for p in processes:
        p.terminate()
    for p in processes:
        p.wait(60)


def report(dsn: str, started: float, finished: bool) -> int:
    """Print the outcome counts; exit status 0 when every document is terminal, else 1."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        counts = domain.status_counts(conn)
    print(f"{'all documents terminal' if finished else 'TIMED OUT'} after {time.monotonic() - started:.1f}s: "
          + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return 0 if finished else 1
