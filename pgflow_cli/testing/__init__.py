"""Run your flows to completion from your own tests, on a throwaway database with the real pgflow SQL.

Nothing is imitated: the database is built by the same installer as ``pgflow migrate`` (PGMQ and
every migration), the run is started and awaited by :mod:`pgflow_cli.client`, and the flow's handlers
run in this process on the reference worker (:class:`pgflow_cli.worker.Worker`, threads), so a test
can patch what they call. The state machine that moves the run is PostgreSQL's, not a second one.

With pytest, enable the fixtures in your ``conftest.py``::

    pytest_plugins = ["pgflow_cli.testing.pytest_plugin"]

and write tests such as (examples/testing/)::

    from pgflow_cli.testing import run_flow
    from myapp.flows import greet

    def test_greets(pgflow_database):
        result = run_flow(greet, {"first": "Ada", "last": "Lovelace"}, pgflow_database)
        assert result.step_outputs == {"fullName": "Ada Lovelace", "greeting": "Hello, Ada Lovelace!"}

Where the server comes from: ``PGFLOW_TEST_ADMIN_DSN`` (a server on which the given role may create
and drop databases), otherwise a private server started in a temporary directory from the
PostgreSQL binaries on this machine (as ``pgflow sandbox`` finds them), stopped and deleted at the
end. Every test gets its own database, cloned from a template installed once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic

import psycopg
from psycopg import sql

from pgflow_cli import db, installer
from pgflow_cli.client import Client, PollPolicy, RunFailed, RunOutcome, RunState
from pgflow_cli.client.core import S
from pgflow_cli.sandbox.embedded import LocalServer
from pgflow_cli.worker import Flow, StepQueuedFlow, Worker, WorkerOptions

ADMIN_DSN_ENV = "PGFLOW_TEST_ADMIN_DSN"
"""Environment variable naming an existing server to build the throwaway databases on."""

TEST_POLL = PollPolicy(first_interval=0.02, factor=1.5, max_interval=0.25, reconnect_timeout=5.0)
"""Tests look at the run often: a quicker test is worth more than a few statements on a throwaway database."""

WORKER_OPTIONS = WorkerOptions(max_poll_seconds=1, poll_interval_ms=20, heartbeat_interval=1.0, drain_timeout=30.0)
"""Short polls: a worker notices new tasks and its stop quickly (no effect on what the handlers see)."""


@dataclass(frozen=True)
class FlowDatabase:
    """One throwaway database with PGMQ and the pgflow schema.

    Attributes:
        name: the database name.
        conninfo: its connection string (pass it to :func:`run_flow`, a :class:`~pgflow_cli.client.Client`,
            your own code).
    """

    name: str
    conninfo: str


class ThrowawayServer:
    """A PostgreSQL server on which throwaway pgflow databases are made, one per test.

    Make it with :meth:`start` (a private server of its own) or :meth:`existing`; then
    :meth:`database` per test; :meth:`close` at the end (drops what it made; stops a private server).
    """

    def __init__(self, admin_conninfo: str, *, server: LocalServer | None = None, base_dir: Path | None = None) -> None:
        self.admin_conninfo = admin_conninfo
        self._server = server
        self._base_dir = base_dir
        self._template: str | None = None
        self._prefix = f"pgflow_test_{uuid.uuid4().hex[:8]}"
        self._count = 0

    @classmethod
    def start(cls, base_dir: Path | None = None) -> ThrowawayServer:
        """Start a private server (Unix socket only, no durability settings: a test server).

        Args:
            base_dir: where its files go (a new temporary directory under /tmp by default, deleted by
                :meth:`close`; as root the server runs as the ``postgres`` user, which must be able to
                enter it).

        Raises:
            ServerError: no PostgreSQL server binaries on this machine (install them, or set
                ``PGFLOW_TEST_ADMIN_DSN``).
        """
        owned = base_dir is None
        base = Path(tempfile.mkdtemp(prefix="pgflow-test-", dir="/tmp")) if base_dir is None else Path(base_dir)
        os.chmod(base, 0o755)
        server = LocalServer(base / "pg")
        try:
            server.start()
            server.wait_ready()
        except BaseException:
            server.destroy()
            if owned:
                shutil.rmtree(base, ignore_errors=True)
            raise
        return cls(server.conninfo("postgres"), server=server, base_dir=base if owned else None)

    @classmethod
    def existing(cls, admin_conninfo: str | None = None) -> ThrowawayServer:
        """Use a running server (``admin_conninfo``, default ``$PGFLOW_TEST_ADMIN_DSN``) whose role may
        create databases; PGMQ is installed from this package into each database that lacks it."""
        conninfo = admin_conninfo or os.environ.get(ADMIN_DSN_ENV)
        if not conninfo:
            raise ValueError(f"no admin connection string: pass one or set {ADMIN_DSN_ENV}")
        return cls(conninfo)

    @classmethod
    def from_environment(cls) -> ThrowawayServer:
        """:meth:`existing` when ``PGFLOW_TEST_ADMIN_DSN`` is set, else :meth:`start`."""
        return cls.existing() if os.environ.get(ADMIN_DSN_ENV) else cls.start()

    def _admin(self) -> psycopg.Connection[Any]:
        return db.connect(db.Target(self.admin_conninfo, "test server"), application_name="pgflow-testing")

    def _conninfo(self, name: str) -> str:
        from psycopg.conninfo import make_conninfo

        return make_conninfo(self.admin_conninfo, dbname=name)

    def _template_name(self) -> str:
        if self._template is None:
            name = f"{self._prefix}_template"
            with self._admin() as admin:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            with db.connect(db.Target(self._conninfo(name), "test template")) as conn:
                installer.install(conn)
            self._template = name
        return self._template

    @contextlib.contextmanager
    def database(self) -> Iterator[FlowDatabase]:
        """A fresh database cloned from the installed template (built on first use), dropped afterwards
        (with every connection to it)."""
        template = self._template_name()
        self._count += 1
        name = f"{self._prefix}_{self._count}"
        with self._admin() as admin:
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                          sql.Identifier(template)))
        try:
            yield FlowDatabase(name, self._conninfo(name))
        finally:
            with self._admin() as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def close(self) -> None:
        """Drop the template; stop and delete a private server."""
        if self._server is not None:
            self._server.destroy()
            if self._base_dir is not None:
                shutil.rmtree(self._base_dir, ignore_errors=True)
            return
        if self._template is not None:
            with self._admin() as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(self._template)))
            self._template = None


@dataclass(frozen=True)
class FlowRun(Generic[S]):
    """How a run of :func:`run_flow` ended.

    Attributes:
        run_id: the run.
        status: ``completed`` or ``failed``.
        output: the run's output (``{leaf_step: output}``) when completed, else ``None``.
        step_outputs: ``{step: output}`` of every step that completed (also in a failed run).
        state: the run with all its step states, as the database holds them.
        failure: the :class:`~pgflow_cli.client.RunFailed` of a failed run (its ``failures``: the
            failed steps and their errors), else ``None``.
    """

    run_id: str
    status: str
    output: dict[S, Any] | None
    step_outputs: dict[S, Any]
    state: RunState[S]
    failure: RunFailed | None = field(default=None)

    def raise_for_failure(self) -> FlowRun[S]:
        """``self``, or raise :attr:`failure` when the run failed."""
        if self.failure is not None:
            raise self.failure
        return self


def _workers(flow: Flow[Any] | StepQueuedFlow[Any], conninfo: str) -> list[Worker]:
    """One worker for a plain flow; one per queue-backed step of a step-queued flow."""
    name = f"{flow.slug}-test"[:60]
    if isinstance(flow, StepQueuedFlow):
        return [Worker(flow, conninfo, function_name=f"{name}-{index}", step_slug=step, options=WORKER_OPTIONS)
                for index, step in enumerate(flow.routes)]
    return [Worker(flow, conninfo, function_name=name, options=WORKER_OPTIONS)]


def run_flow(flow: Flow[S] | StepQueuedFlow[S], input: Any, database: FlowDatabase | str, *,
             timeout: float = 60.0) -> FlowRun[S]:
    """Run ``flow`` on ``input`` to its end and return every step's output, or the failure.

    Starts the flow's worker(s) in this process (which compile the flow into the database, as in
    production), starts one run through the client, awaits it and stops the workers. Retries follow
    the flow's own options (a failing handler is retried ``max_attempts`` times, ``base_delay``
    seconds apart, doubling: give the flow ``base_delay=0`` to test failures quickly).

    Args:
        flow: the flow with its handlers (plain, or made by ``with_step_queues``).
        input: the run input (a JSON value).
        database: a :class:`FlowDatabase` or a connection string of a database with the pgflow schema.
        timeout: seconds the run may take.

    Returns:
        The ended run; a failed run is returned, not raised (:meth:`FlowRun.raise_for_failure`).

    Raises:
        WaitTimeout: the run did not end within ``timeout`` (a manual step nobody completes, a handler
            that hangs).
        WorkerStartupError: the database refused the flow (a shape that differs from the one compiled
            there before).
    """
    conninfo = database.conninfo if isinstance(database, FlowDatabase) else database
    workers = _workers(flow, conninfo)
    try:
        for worker in workers:
            worker.start()
        with Client(conninfo, poll=TEST_POLL, application_name="pgflow-testing") as client:
            run = client.start(flow, input)
            outcome: RunOutcome[S] = client.outcome(run, timeout=timeout)
            state = client.get(run)
    finally:
        for worker in workers:
            worker.stop("test run ended")
        for worker in workers:
            worker.join(WORKER_OPTIONS.drain_timeout + 5)
    return FlowRun(outcome.run_id, outcome.status, outcome.output, state.step_outputs, state,
                   None if outcome.ok else RunFailed(outcome))
