"""A test database built from a published pgflow release (``@pgflow/core`` on the npm registry).

The audit must be proven on a schema nobody on this project wrote (DESIGN.md "How we know it
works"). This module:

1. fetches the release tarball once with ``npm pack`` into a cache directory
   (``$PGFLOW_TEST_CACHE``, else ``~/.cache/pgflow-cli-tests``); later runs reuse it offline;
2. reads the release's SQL migrations (``package/dist/supabase/migrations/*.sql``) straight out
   of the tarball (nothing is extracted to disk);
3. installs PGMQ *as an extension* from the SQL bundled in the ``pgmq`` PyPI package, by writing
   ``pgmq.control`` and ``pgmq--<version>.sql`` into the server's extension directory (the
   release's first migration runs ``CREATE EXTENSION pgmq``);
4. adds a do-nothing stand-in for Supabase's ``realtime.send(payload, event, topic, private)``,
   which the release's runtime functions call on every state change;
5. applies the migrations in file-name order, one transaction each;
6. creates flows, steps and runs through the release's own functions (``create_flow``,
   ``add_step``, ``start_flow``, ``start_tasks``, ``complete_task``) plus a few queue-level
   hazards made with PGMQ functions or plain DDL, as an operator's database could hold them.

:data:`EXPECTED_FINDINGS` lists exactly what the audit must report on that database.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import psycopg

RELEASE = "0.8.1"
PACKAGE = "@pgflow/core"
TARBALL = f"pgflow-core-{RELEASE}.tgz"
MIGRATIONS_PREFIX = "package/dist/supabase/migrations/"

LONG_FLOW = "warehouse_inventory_reconciliation_pipeline_x"
"""45 characters: its default queue fits PGMQ's 47, but ``flow__0`` (48) does not."""
assert len(LONG_FLOW) == 45

TOO_LONG_FLOW = "customer_lifetime_value_recalculation_for_regions"
"""49 characters: valid under the slug rules (128), but its queue name exceeds PGMQ's 47."""
assert len(TOO_LONG_FLOW) == 49

WIDE_QUEUE = "é" * 31
"""31 characters (within 47) but 62 bytes: ``q_`` + name is 64 bytes, over PostgreSQL's 63."""


class PublishedReleaseError(RuntimeError):
    """The published-release database cannot be built on this machine (message says why)."""


def cache_dir() -> Path:
    """Where downloaded release tarballs are kept between test runs."""
    configured = os.environ.get("PGFLOW_TEST_CACHE")
    path = Path(configured) if configured else Path.home() / ".cache" / "pgflow-cli-tests"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_release() -> Path:
    """Return the cached release tarball, downloading it with ``npm pack`` the first time."""
    target = cache_dir() / TARBALL
    if target.is_file() and target.stat().st_size > 0:
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise PublishedReleaseError(
            f"npm is needed once to download {PACKAGE}@{RELEASE} (or put {TARBALL} into {cache_dir()})"
        )
    with tempfile.TemporaryDirectory(prefix="pgflow-npm-") as scratch:
        proc = subprocess.run(
            [npm, "pack", f"{PACKAGE}@{RELEASE}", "--pack-destination", scratch, "--silent"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=scratch,
        )
        produced = Path(scratch) / TARBALL
        if proc.returncode != 0 or not produced.is_file():
            raise PublishedReleaseError(
                f"`npm pack {PACKAGE}@{RELEASE}` failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
            )
        partial = target.with_suffix(".part")
        shutil.copyfile(produced, partial)
        os.replace(partial, target)
    return target


def release_migrations(tarball: Path | None = None) -> list[tuple[str, str]]:
    """The release's migrations as ``(file name, SQL text)``, in apply order."""
    tarball = tarball or fetch_release()
    found: list[tuple[str, str]] = []
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive.getmembers():
            if not member.isfile() or not member.name.startswith(MIGRATIONS_PREFIX):
                continue
            name = member.name[len(MIGRATIONS_PREFIX):]
            if "/" in name or not name.endswith(".sql"):
                continue
            handle = archive.extractfile(member)
            assert handle is not None
            found.append((name, io.TextIOWrapper(handle, encoding="utf-8").read()))
    if not found:
        raise PublishedReleaseError(f"{tarball} holds no SQL migrations under {MIGRATIONS_PREFIX}")
    return sorted(found)


def install_pgmq_extension_files(admin: psycopg.Connection) -> str:
    """Make ``CREATE EXTENSION pgmq`` possible on the server behind ``admin``.

    Writes the control file and the install script (the SQL bundled in the ``pgmq`` PyPI
    package) into the server's ``SHAREDIR/extension``. Idempotent; files are replaced
    atomically so concurrent test runs never see half a file.

    Returns:
        The PGMQ version installed.
    """
    from pgflow_cli.installer import bundled_pgmq_sql

    version, script = bundled_pgmq_sql()
    row = admin.execute("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'").fetchone()
    sharedir = Path(row[0]) if row else Path(_pg_config_sharedir())
    extdir = sharedir / "extension"
    control = (
        "# PGMQ installed for pgflow-cli's published-release tests\n"
        f"default_version = '{version}'\n"
        "relocatable = false\n"
        "schema = pgmq\n"
        "trusted = true\n"
        "comment = 'message queues on PostgreSQL tables (PGMQ, SQL from the pgmq PyPI package)'\n"
    )
    files = {extdir / "pgmq.control": control, extdir / f"pgmq--{version}.sql": script}
    for path, content in files.items():
        if path.is_file() and path.read_text(encoding="utf-8") == content:
            continue
        try:
            fd, tmp = tempfile.mkstemp(prefix=".pgmq-", dir=extdir)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(content)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except PermissionError as exc:
            raise PublishedReleaseError(
                f"cannot write {path}: {exc.strerror}. Installing PGMQ as an extension needs write access "
                f"to PostgreSQL's extension directory ({extdir}); run the tests as root (as CI does) or "
                "copy the pgmq control and SQL files there once"
            ) from None
    return version


def _pg_config_sharedir() -> str:
    pg_config = shutil.which("pg_config")
    if not pg_config:
        raise PublishedReleaseError("cannot find PostgreSQL's share directory (no pg_config)")
    return subprocess.run([pg_config, "--sharedir"], capture_output=True, text=True, check=True).stdout.strip()


REALTIME_STUB = """
CREATE SCHEMA IF NOT EXISTS realtime;
CREATE OR REPLACE FUNCTION realtime.send(payload jsonb, event text, topic text, private boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
AS 'BEGIN NULL; END';
COMMENT ON FUNCTION realtime.send(jsonb, text, text, boolean) IS
  'test stand-in for Supabase Realtime: accepts broadcasts and drops them';
"""

# Flows, steps and runs, created through the 0.8.1 functions. Each block names the finding(s)
# it provokes; EXPECTED_FINDINGS below must stay in step with it.
SCENARIO = f"""
-- clean flows: no finding at all
SELECT pgflow.create_flow('reindex');
SELECT pgflow.add_step('reindex', 'scan');
SELECT pgflow.add_step('reindex', 'rebuild', ARRAY['scan']);

-- camelCase flow: valid, but its PGMQ meta row is spelled in mixed case
SELECT pgflow.create_flow('greetUser');
SELECT pgflow.add_step('greetUser', 'fetchUser');
SELECT pgflow.add_step('greetUser', 'sendGreeting', ARRAY['fetchUser']);

-- flow slugs the new rules reject
SELECT pgflow.create_flow('_legacy_import');
SELECT pgflow.add_step('_legacy_import', 'load');
SELECT pgflow.create_flow('report__daily_');
SELECT pgflow.add_step('report__daily_', 'collect');
SELECT pgflow.add_step('report__daily_', 'render', ARRAY['collect']);

-- step slugs the new rules reject (and one valid step)
SELECT pgflow.create_flow('orders');
SELECT pgflow.add_step('orders', 'validate');
SELECT pgflow.add_step('orders', '_prepare', ARRAY['validate']);
SELECT pgflow.add_step('orders', 'ship_', ARRAY['_prepare']);
SELECT pgflow.add_step('orders', 'pack__items', ARRAY['_prepare']);
SELECT pgflow.add_step('orders', '__all__', ARRAY['ship_', 'pack__items']);

-- flow slugs equal ignoring case: two meta rows, one physical queue
SELECT pgflow.create_flow('MyFlow');
SELECT pgflow.add_step('MyFlow', 'work');
SELECT pgflow.create_flow('myflow');
SELECT pgflow.add_step('myflow', 'work');

-- step slugs equal ignoring case within one flow
SELECT pgflow.create_flow('ingest');
SELECT pgflow.add_step('ingest', 'loadData');
SELECT pgflow.add_step('ingest', 'loaddata');

-- queue missing entirely (meta row and both tables)
SELECT pgflow.create_flow('cleanup');
SELECT pgflow.add_step('cleanup', 'sweep');
SELECT pgmq.drop_queue('cleanup');

-- queue table dropped behind PGMQ's back (meta row and archive remain)
SELECT pgflow.create_flow('audit_log');
SELECT pgflow.add_step('audit_log', 'append');
DROP TABLE pgmq.q_audit_log;

-- meta row re-created in another spelling than the flow slug
SELECT pgflow.create_flow('shipping');
SELECT pgflow.add_step('shipping', 'label');
SELECT pgmq.drop_queue('shipping');
SELECT pgmq.create('Shipping');

-- an existing queue named like the private step queue a flow would generate
SELECT pgflow.create_flow('billing');
SELECT pgflow.add_step('billing', 'charge');
SELECT pgmq.create('billing__charge');

-- a flow whose private step queue names cannot be generated (45-character slug)
SELECT pgflow.create_flow('{LONG_FLOW}');
SELECT pgflow.add_step('{LONG_FLOW}', 'count');

-- a flow whose default queue name is over PGMQ's limit: such flows exist where an older
-- PGMQ did not check the length; create_flow on PGMQ 1.13 refuses it, so insert the row
INSERT INTO pgflow.flows (flow_slug) VALUES ('{TOO_LONG_FLOW}');

-- queues no flow owns; one of them is over the identifier limit in bytes
SELECT pgmq.create('adhoc_jobs');
SELECT pgmq.create('{WIDE_QUEUE}');

-- runs (messages in the queues), one claimed task, one completed task
SELECT count(*) FROM pgflow.start_flow('greetUser', '{{"user": 1}}'::jsonb);
SELECT count(*) FROM pgflow.start_flow('greetUser', '{{"user": 2}}'::jsonb);
SELECT count(*) FROM pgflow.start_flow('orders', '{{"order": 7}}'::jsonb);
SELECT count(*) FROM pgflow.start_flow('MyFlow', '{{}}'::jsonb);
SELECT count(*) FROM pgflow.start_flow('report__daily_', '{{}}'::jsonb);
SELECT count(*) FROM pgflow.start_flow('reindex', '{{}}'::jsonb);
INSERT INTO pgflow.workers (worker_id, queue_name, function_name)
VALUES ('00000000-0000-4000-8000-000000000001', 'greetUser', 'greet-user-worker');
SELECT count(*) FROM pgflow.start_tasks(
  'greetUser',
  ARRAY(SELECT message_id FROM pgflow.step_tasks WHERE flow_slug = 'greetUser' AND status = 'queued'
        ORDER BY message_id),
  '00000000-0000-4000-8000-000000000001');
SELECT count(*) FROM pgflow.complete_task(
  (SELECT run_id FROM pgflow.step_tasks WHERE flow_slug = 'greetUser' AND status = 'started'
   ORDER BY message_id LIMIT 1),
  'fetchUser', 0, '{{"name": "Ada"}}'::jsonb);
"""

EXPECTED_FINDINGS: set[tuple[str, str | None, str | None, str, tuple[str, ...]]] = {
    # (check_id, flow_slug, step_slug, object_name, reasons)
    ("flow_slug_rejected", "_legacy_import", None, "_legacy_import", ("leading_underscore",)),
    ("flow_slug_rejected", "report__daily_", None, "report__daily_", ("trailing_underscore", "double_underscore")),
    ("step_slug_rejected", "orders", "_prepare", "_prepare", ("leading_underscore",)),
    ("step_slug_rejected", "orders", "ship_", "ship_", ("trailing_underscore",)),
    ("step_slug_rejected", "orders", "pack__items", "pack__items", ("double_underscore",)),
    ("step_slug_rejected", "orders", "__all__", "__all__",
     ("leading_underscore", "trailing_underscore", "double_underscore")),
    ("flow_slug_case_conflict", "MyFlow", None, "MyFlow", ("case_only_duplicate",)),
    ("flow_slug_case_conflict", "myflow", None, "myflow", ("case_only_duplicate",)),
    ("step_slug_case_conflict", "ingest", "loadData", "loadData", ("case_only_duplicate",)),
    ("step_slug_case_conflict", "ingest", "loaddata", "loaddata", ("case_only_duplicate",)),
    ("queue_alias_conflict", "MyFlow", None, "MyFlow", ("same_physical_table",)),
    ("queue_alias_conflict", "myflow", None, "myflow", ("same_physical_table",)),
    ("flow_queue_name_too_long", TOO_LONG_FLOW, None, TOO_LONG_FLOW, ("too_many_characters",)),
    ("flow_queue_missing", "cleanup", None, "cleanup",
     ("meta_row_missing", "queue_table_missing", "archive_table_missing")),
    ("flow_queue_missing", "audit_log", None, "audit_log", ("queue_table_missing",)),
    ("flow_queue_missing", TOO_LONG_FLOW, None, TOO_LONG_FLOW,
     ("meta_row_missing", "queue_table_missing", "archive_table_missing")),
    ("queue_meta_spelling", "greetUser", None, "greetUser", ("not_lowercase",)),
    ("queue_meta_spelling", "MyFlow", None, "MyFlow", ("not_lowercase",)),
    ("queue_meta_spelling", "shipping", None, "Shipping", ("not_lowercase", "differs_from_flow_slug")),
    ("step_queue_collision", "billing", "charge", "billing__charge", ("generated_step_queue_name",)),
    ("queue_name_too_long", None, None, WIDE_QUEUE, ("too_many_bytes",)),
    ("queue_unowned", None, None, "adhoc_jobs", ("no_owning_flow",)),
    ("queue_unowned", None, None, WIDE_QUEUE, ("no_owning_flow",)),
    ("step_queues_unavailable", LONG_FLOW, None, LONG_FLOW, ("queue_name_too_long",)),
}
"""Exactly what ``pgflow audit`` must report on the published-release database."""


def build(conninfo: str, admin: psycopg.Connection) -> None:
    """Build the published-release database at ``conninfo`` (an empty database)."""
    build_schema(conninfo, admin)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SET LOCAL client_min_messages = warning")
            conn.execute(SCENARIO)  # type: ignore[arg-type]


def build_schema(conninfo: str, admin: psycopg.Connection) -> None:
    """Only the release's own migrations (and the Realtime stand-in) in the empty database at ``conninfo``."""
    install_pgmq_extension_files(admin)
    migrations = release_migrations()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(REALTIME_STUB)
        for name, text in migrations:
            try:
                with conn.transaction():
                    conn.execute(text)  # type: ignore[arg-type]  # the release's own SQL
            except psycopg.Error as exc:
                raise PublishedReleaseError(f"{PACKAGE}@{RELEASE} migration {name} failed: {exc}") from exc
