"""Test fixtures: a real PostgreSQL server with real PGMQ, a fresh database per test.

Fixtures:

* ``harness``: the session's server (see tests/support/server.py; under pytest-xdist one server
  for all workers, started by the controller in :func:`pytest_configure_node`);
* ``db``: a fresh database with PGMQ and every pgflow migration;
* ``baseline_db``: PGMQ and only the baseline migrations (the pre-upgrade state);
* ``empty_db``: a database with nothing installed;
* ``client_role_names``: taken by tests that create and drop the fixed cluster-wide roles
  ``anon``/``authenticated``, so two xdist workers never do it at the same time;
* ``published_db``: a database built from the published ``@pgflow/core`` release
  (tests/support/published.py), holding exactly ``published.EXPECTED_FINDINGS``;
* ``pgbouncer``: a real PgBouncer in transaction mode in front of the server (one per xdist worker,
  :class:`pgflow_cli.sandbox.pooler.LocalPooler`), strict: every server connection is reset after
  each transaction, so reliance on session state fails every time; tests that take it are skipped,
  saying why, only where the ``pgbouncer`` binary is missing (.ci/run installs it);
* ``pooled``: the test's ``db`` through that PgBouncer (:meth:`TestDatabase.through`): ``conninfo``
  and ``connect()`` (no prepared statements, as any client of a transaction pooler must).

The process that owns the server (the xdist controller, or the only process) stops and deletes it
however the run ends: normally, on Ctrl-C, and on SIGTERM or SIGHUP, which end the run as Ctrl-C
does (:func:`_end_the_run_on_termination`); an xdist worker that crashes does not own it.
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.sandbox.pooler import LocalPooler, find_pgbouncer
from tests.support import published
from tests.support.server import (
    TERMINATING,
    Harness,
    PooledDatabase,
    TestDatabase,
    start_shared_server,
    stop_shared_server,
)

# before any test module imports it (tests/breaker/s4 uses the claim helpers too)
pytest.register_assert_rewrite("tests.claim.helpers")

BASELINE_VERSION = installer.BASELINE_VERSION
SHARED_SERVER = "pgflow_test_server"
"""Key of the xdist worker input holding the shared server's base directory."""
TERMINAL_ENV = "pgflow_terminal_env"
"""Key of the xdist worker input holding the controller's COLUMNS and LINES (``None``: unset)."""


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist controller, once per worker: start the run's one server (first call) and hand it over."""
    config = node.config
    if not hasattr(config, "_pgflow_shared_server"):
        config._pgflow_shared_server = start_shared_server()
    node.workerinput[SHARED_SERVER] = str(config._pgflow_shared_server)
    node.workerinput[TERMINAL_ENV] = {name: os.environ.get(name) for name in ("COLUMNS", "LINES")}


def _end_the_run_on_termination(config) -> None:
    """SIGTERM and SIGHUP end the run as Ctrl-C does (``pytest.exit``, exit status 128 + the signal):
    fixtures are torn down and :func:`pytest_unconfigure` runs, so the server is stopped and deleted.
    A second signal meanwhile is ignored. The previous handlers are restored at unconfigure."""

    def end(signum: int, _frame) -> None:
        for other in TERMINATING:
            signal.signal(other, signal.SIG_IGN)
        pytest.exit(f"{signal.Signals(signum).name}: ending the run, stopping the test server",
                    returncode=128 + signum)

    config._pgflow_signal_handlers = {signum: signal.signal(signum, end) for signum in TERMINATING}


def pytest_configure(config):
    """The process owning the server (controller or only process): :func:`_end_the_run_on_termination`.

    xdist worker: the terminal size variables as the controller had them. A worker starts with
    COLUMNS=80 and LINES=24 set, which every command a test runs would inherit (run_cli's default
    width is 200 only where COLUMNS is unset)."""
    if not hasattr(config, "workerinput"):
        _end_the_run_on_termination(config)
    for name, value in getattr(config, "workerinput", {}).get(TERMINAL_ENV, {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist: whole test files per worker (``--dist loadfile``), whatever ``--dist`` says. Module
    fixtures (a sandbox server, a seeded database) are then built once, and the tests of one file that
    use a fixed cluster-wide name (a role, a lock) never run at the same time."""
    from xdist.scheduler import LoadFileScheduling

    return LoadFileScheduling(config, log)


def pytest_unconfigure(config):
    """Controller: stop and delete the shared server; then the signal handlers as they were."""
    base = getattr(config, "_pgflow_shared_server", None)
    if base is not None:
        stop_shared_server(base)
    for signum, handler in getattr(config, "_pgflow_signal_handlers", {}).items():
        signal.signal(signum, handler)


@pytest.fixture(scope="session")
def harness(request):
    shared = getattr(request.config, "workerinput", {}).get(SHARED_SERVER)
    h = Harness(Path(shared) if shared else None)
    try:
        yield h
    finally:
        h.close()


def _install(conninfo: str, target: int | None) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        installer.install(conn, target=target)


@pytest.fixture
def db(harness, request) -> Iterator[TestDatabase]:
    yield from harness.fresh(harness.template("latest", lambda c: _install(c, None)), request)


@pytest.fixture
def baseline_db(harness, request) -> Iterator[TestDatabase]:
    yield from harness.fresh(harness.template("baseline", lambda c: _install(c, BASELINE_VERSION)), request)


@pytest.fixture
def empty_db(harness, request) -> Iterator[TestDatabase]:
    yield from harness.fresh(None, request)


CLIENT_ROLES_LOCK = 7310515
"""Advisory-lock key held by :func:`client_role_names` (roles are per server, not per database)."""


@pytest.fixture
def client_role_names(harness) -> Iterator[tuple[str, str]]:
    """``("anon", "authenticated")``, with a server-wide advisory lock held for the test: the roles are
    shared by every database of the server, so only one test at a time may create and drop them."""
    with psycopg.connect(harness.server.conninfo("postgres"), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (CLIENT_ROLES_LOCK,))
        yield ("anon", "authenticated")


@pytest.fixture(scope="session")
def published_template(harness) -> str:
    """Name of the template database built once per test run from the published release."""
    try:
        return harness.template(
            f"published_{published.RELEASE.replace('.', '')}",
            lambda conninfo: published.build(conninfo, harness.admin),
        )
    except published.PublishedReleaseError as exc:
        pytest.fail(f"cannot build the published-release database: {exc}", pytrace=False)


@pytest.fixture
def published_db(harness, published_template, request):
    """A fresh database cloned from the published-release template."""
    yield from harness.fresh(published_template, request)


@pytest.fixture(scope="session")
def pgbouncer(harness) -> Iterator[LocalPooler]:
    """A PgBouncer in transaction mode (strict) in front of the run's server, for this process's tests."""
    if find_pgbouncer() is None:
        pytest.skip("PgBouncer is not installed here (apt-get install pgbouncer; .ci/run installs it in CI)")
    base = tempfile.mkdtemp(prefix="pgflow-pooler-", dir="/tmp")
    pooler = LocalPooler(Path(base), harness.server, pool_mode="transaction", pool_size=10, strict=True)
    try:
        pooler.start()
        yield pooler
    finally:
        pooler.destroy()


@pytest.fixture
def pooled(pgbouncer, db) -> Iterator[PooledDatabase]:
    """The test's ``db`` reached through ``pgbouncer`` (its connections closed after the test)."""
    view = db.through(pgbouncer)
    try:
        yield view
    finally:
        view.close_all()
