"""``pgflow exporter``: serve the database's state as Prometheus metrics (docs/commands/exporter.md)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Annotated, Any

import typer

from pgflow_cli import db, render
from pgflow_cli.cli import common
from pgflow_cli.errors import UsageError
from pgflow_cli.operations import coverage as coverage_op

log = logging.getLogger("pgflow.exporter")

HELP = """Serve the database's state as Prometheus metrics, for dashboards and alerts.

Per route (a plain flow's queue, or each step's private queue): its coverage state (covered,
draining, fenced, stale, uncovered, queue_missing), backlog, visible messages and oldest message
age, and its workers. Per flow: runs and tasks by state, the oldest queued task's age, stalled and
given-up tasks, workers live/deprecated/stale. Active rollout fences and their age; the migration
level, pending migrations and whether an upgrade is in progress. The queries are those of
`pgflow coverage`, `pgflow status` and `pgflow fence status`; docs/observability.md lists every
metric and gives alert rules and a Grafana dashboard.

One snapshot serves every scrape for --cache-seconds: any number of scrapers cost one query set
per interval. /metrics serves the metrics, /healthz answers 200 while the database can be read
(503 otherwise). Nothing exposed holds run inputs, outputs or message bodies.

The exporter only reads: it refuses to start as a role that can write pgflow's or PGMQ's tables
(or run a writing SECURITY DEFINER function), unless --allow-write-role. Needs the metrics extra:
pip install 'pgflow-cli[metrics]'. SIGTERM or Ctrl-C stops it (exit 0).

Exit 0: stopped by SIGTERM or Ctrl-C. Exit 2: bad --listen, the address is in use, a role that
can write (without --allow-write-role), the metrics extra is missing. Exit 3: cannot connect, no
pgflow schema, or the role may not read what it needs (the hint names the GRANT).

\b
Examples:
  pgflow exporter --listen 127.0.0.1:9465 --dsn postgresql://pgflow_exporter@db/app
  pgflow exporter --listen :9465 --cache-seconds 30
  pgflow exporter --listen 127.0.0.1:0 --sandbox --allow-write-role"""


def register(app: typer.Typer) -> None:
    """Attach ``exporter`` to the root command."""
    app.command("exporter", help=HELP)(common.option_groups(exporter))


def exporter(
    listen: Annotated[str, typer.Option(
        "--listen", metavar="HOST:PORT", help="Address to serve on: 127.0.0.1:9465 (this machine), :9465 (every "
        "interface), [::1]:9465; port 0 picks a free port (logged at start).")] = "127.0.0.1:9465",
    cache_seconds: Annotated[float, typer.Option(
        "--cache-seconds", min=0, metavar="SECONDS", help="Seconds one snapshot serves scrapes (0: read the "
        "database on every scrape; concurrent scrapes still share one read).")] = 10.0,
    heartbeat_window: Annotated[float, typer.Option(
        "--heartbeat-window", min=0.1, metavar="SECONDS",
        help="A worker is live when its last heartbeat is at most this old (as in pgflow coverage).")]
    = coverage_op.DEFAULT_HEARTBEAT_WINDOW,
    allow_write_role: Annotated[bool, typer.Option(
        "--allow-write-role", help="Run even when the role can write pgflow's data (a development database).")]
    = False,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    try:
        from pgflow_cli.operations import exporter as exporter_op
    except ImportError as exc:
        raise UsageError(f"the exporter needs the prometheus-client package, which is not installed ({exc})",
                         hint="pip install 'pgflow-cli[metrics]'") from None
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    host, port = exporter_op.parse_listen(listen)
    conn, target = where.open()
    with conn, common.mapped_errors(target, conn):
        writable = exporter_op.check_role(conn, allow_write=allow_write_role)
        exporter_op.read_snapshot(conn, heartbeat_window=heartbeat_window)  # unreadable: exit 3 now, not per scrape
    if writable:
        render.stderr_console().print(render.text(
            f"warning: the exporter's role can write ({len(writable)} object(s), e.g. {writable[0]}); running because "
            "of --allow-write-role", "yellow"))

    def connect() -> Any:
        return db.connect(target, application_name="pgflow-exporter", connect_timeout=where.connect_timeout)

    served = exporter_op.Exporter(connect, host=host, port=port, cache_seconds=cache_seconds,
                                  heartbeat_window=heartbeat_window)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        log.info("pgflow exporter: metrics on %s/metrics, health on %s/healthz (database %s, snapshots cached %gs)",
                 served.server.url, served.server.url, target.describe(), cache_seconds,
                 extra={"event": "exporter_serving", "listen_host": served.address[0],
                        "listen_port": served.address[1]})
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        served.close()
