"""Demo flows for the sandbox: definitions, handlers, the ``demo`` seed and demo workers.

The seed builds what a production database looks like just before the queue-identity
upgrade, entirely through the real paths (worker startup compilation, ``start_flow``,
real workers claiming and completing tasks):

* ``greetUser`` and ``processOrder``: compliant flows with completed, failed, queued and
  started (claimed by a worker that then "crashed") runs;
* ``_legacyImport`` and ``report__daily``: slugs the new rules reject;
* ``Billing`` and ``billing``: flow slugs equal ignoring case (one physical PGMQ table);
* ``etl``: two steps equal ignoring case (``loadData`` and ``LoadData``).

Handlers are deterministic so the seed always ends in the same states.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgflow_cli import db, sqlfiles
from pgflow_cli.errors import UsageError
from pgflow_cli.worker import Flow, Worker, WorkerOptions, WorkerStartupError
from pgflow_cli.worker.protocol import for_version

QUERIES = "queries/demo.sql"
FUNCTION_PREFIX = "demo-"
CRASHED_WORKER = "00000000-0000-4000-8000-00000000dead"


class DemoFailure(Exception):
    """Raised by demo handlers on purpose (a declined card)."""


def _charge(order: dict[str, Any], _ctx: Any) -> dict[str, Any]:
    amount = order["validate"]["amount"]
    if amount > 1000:
        raise DemoFailure(f"card declined for amount {amount}")
    return {"charged": amount}


def demo_flows() -> list[Flow]:
    """Every demo flow, in seeding order (legacy slugs allowed: this is pre-upgrade data)."""
    greet = (
        Flow("greetUser", legacy_slugs=True, timeout=30)
        .step("fetchUser", lambda run, ctx: {"name": f"user-{run['user']}"})
        .step("sendGreeting", lambda deps, ctx: f"Hello, {deps['fetchUser']['name']}!", depends_on=["fetchUser"])
    )
    order = (
        Flow("processOrder", legacy_slugs=True, max_attempts=1, timeout=30)
        .step("validate", lambda run, ctx: {"amount": run["amount"], "items": run["items"]})
        .step("listItems", lambda deps, ctx: deps["validate"]["items"], depends_on=["validate"])
        .map("packItems", lambda item, ctx: f"packed {item}", array="listItems")
        .step("chargeCard", _charge, depends_on=["validate"])
        .step("ship", lambda deps, ctx: {"parcels": len(deps["packItems"])}, depends_on=["packItems", "chargeCard"])
    )
    legacy_import = Flow("_legacyImport", legacy_slugs=True).step("load", lambda run, ctx: run)
    report = (
        Flow("report__daily", legacy_slugs=True)
        .step("collect", lambda run, ctx: [1, 2, 3])
        .step("render_", lambda deps, ctx: sum(deps["collect"]), depends_on=["collect"])
    )
    billing_upper = Flow("Billing", legacy_slugs=True).step("invoice", lambda run, ctx: run)
    billing_lower = Flow("billing", legacy_slugs=True).step("invoice", lambda run, ctx: run)
    etl = (
        Flow("etl", legacy_slugs=True)
        .step("loadData", lambda run, ctx: run)
        .step("LoadData", lambda run, ctx: run)
    )
    return [greet, order, legacy_import, report, billing_upper, billing_lower, etl]


RUNNABLE = ("greetUser", "processOrder")
"""Demo flows that demo workers serve before the upgrade (the others exist to be reported by the audit)."""
RUNNABLE_AFTER_UPGRADE = (*RUNNABLE, "billing")
"""From protocol 2 on no case alias is left (the upgrade refuses one), so the lower-case ``billing`` flow,
whose queue ``Billing`` shared before, can be served too (docs/upgrade.md's rehearsal keeps it)."""


def runnable(protocol_version: int) -> tuple[str, ...]:
    """The demo flows demo workers may serve on a database speaking ``protocol_version``."""
    return RUNNABLE if protocol_version < 2 else RUNNABLE_AFTER_UPGRADE


def function_name(flow_slug: str) -> str:
    """Worker function name of a demo flow, e.g. ``demo-greetUser``."""
    return FUNCTION_PREFIX + flow_slug


def database_protocol(conn: psycopg.Connection) -> int:
    """Protocol version the database speaks (demo workers adapt to it; real workers must not)."""
    version = for_version(1).database_version(conn)
    return version or 1


def _connect(conninfo: str) -> psycopg.Connection:
    """An autocommit connection to the demo database through :func:`pgflow_cli.db.connect`."""
    return db.connect(db.Target(conninfo, "sandbox"), application_name="pgflow-cli demo")


def seed(conninfo: str, progress: Callable[[str], None] = lambda message: None) -> dict[str, int]:
    """Load the demo seed into an empty pre-upgrade database.

    Returns:
        Counts of runs by state after seeding, e.g. ``{"completed": 6, "failed": 2, ...}``.
    """
    flows = {flow.slug: flow for flow in demo_flows()}
    with _connect(conninfo) as conn:
        protocol = for_version(database_protocol(conn))
        protocol.check_version(conn)
        for flow in flows.values():
            protocol.compile(conn, flow.slug, flow.shape(), None)
        progress(f"compiled {len(flows)} demo flows")

        # Finished runs: start them, let real workers process them, stop the workers.
        for user in range(1, 5):
            _start(conn, "greetUser", {"user": user})
        for amount, items in ((120, ["book", "lamp"]), (80, ["pen"]), (2500, ["tv"]), (45, ["mug", "tea", "cup"]), (1999, ["bike"])):
            _start(conn, "processOrder", {"amount": amount, "items": items})
        _drain(conninfo, [flows[slug] for slug in RUNNABLE], protocol, progress)

        # In-flight runs: queued work nobody has picked up yet ...
        for user in range(5, 8):
            _start(conn, "greetUser", {"user": user})
        for amount, items in ((60, ["cable"]), (300, ["desk", "chair"])):
            _start(conn, "processOrder", {"amount": amount, "items": items})
        for slug in ("_legacyImport", "report__daily", "Billing", "billing", "etl"):
            _start(conn, slug, {"source": "nightly"})
        # ... and one task claimed by a worker that then vanished (stalled recovery requeues it).
        _claim_and_vanish(conn, protocol, "processOrder")
        counts = {row[0]: int(row[1]) for row in conn.execute(sqlfiles.statement(QUERIES, "run_counts")).fetchall()}
    progress("demo runs: " + ", ".join(f"{count} {state}" for state, count in sorted(counts.items())))
    return counts


def _start(conn: psycopg.Connection, flow_slug: str, run_input: dict[str, Any]) -> None:
    conn.execute(sqlfiles.statement(QUERIES, "start_run"), {"flow_slug": flow_slug, "input": Jsonb(run_input)})


def _drain(conninfo: str, flows: list[Flow], protocol: Any, progress: Callable[[str], None], timeout: float = 60) -> None:
    workers = [
        Worker(flow, conninfo, function_name=function_name(flow.slug), protocol=type(protocol)(),
               options=WorkerOptions(max_poll_seconds=1, heartbeat_interval=1, application_name="pgflow-cli demo seed"))
        for flow in flows
    ]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + timeout
        with _connect(conninfo) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(sqlfiles.statement(QUERIES, "runs_in_flight"), {"flows": [f.slug for f in flows]}).fetchone()
                if row and int(row[0]) == 0:
                    break
                time.sleep(0.2)
    finally:
        for worker in workers:
            worker.stop("seed done")
        for worker in workers:
            worker.join(30)
    progress("processed the finished demo runs with real workers")


def _claim_and_vanish(conn: psycopg.Connection, protocol: Any, flow_slug: str) -> None:
    protocol.register(conn, worker_id=CRASHED_WORKER, function_name=function_name(flow_slug) + "-crashed",
                      queue_name=protocol.queue_name(flow_slug, None), flow_slug=flow_slug, step_slug=None)
    ids = protocol.read(conn, queue_name=protocol.queue_name(flow_slug, None), vt=30, qty=1,
                        max_poll_seconds=1, poll_interval_ms=50)
    if ids:
        protocol.claim(conn, flow_slug=flow_slug, step_slug=None, queue_name=protocol.queue_name(flow_slug, None),
                       message_ids=ids, worker_id=CRASHED_WORKER)


def run_workers(conninfo: str, flow_slugs: list[str] | None = None, *, max_concurrent: int = 4,
                maintenance_interval: float = 15.0, stop_after: float | None = None,
                until_idle: bool = False) -> int:
    """Run demo workers in the foreground until SIGTERM/SIGINT (or ``stop_after`` seconds, or idle).

    The sandbox has no pg_cron, so this also calls ``pgflow.requeue_stalled_tasks()`` every
    ``maintenance_interval`` seconds, as the cron job would in production (every 0.5 s when the
    run is bounded by ``stop_after`` or ``until_idle``, so a stalled claim comes back as soon as
    its step timeout + 30 s have passed).

    Args:
        until_idle: also stop once no run of the served flows is in flight (``started``).

    Returns:
        How many runs of the served flows are still in flight at the stop (0: idle).
    """
    import signal
    import threading

    with _connect(conninfo) as conn:
        protocol_version = database_protocol(conn)
        present = {row[0] for row in conn.execute(sqlfiles.statement(QUERIES, "flow_slugs"))}
    allowed = runnable(protocol_version)
    refused = [slug for slug in flow_slugs or () if slug not in allowed]
    if refused:
        raise UsageError(f"not a runnable demo flow at protocol {protocol_version}: {', '.join(refused)}",
                         hint="choose from: " + ", ".join(allowed))
    chosen = [f for f in demo_flows() if f.slug in (flow_slugs or allowed) and f.slug in present]
    workers = [
        Worker(flow, conninfo, function_name=function_name(flow.slug), protocol=for_version(protocol_version),
               worker_id=str(uuid.uuid4()),
               options=WorkerOptions(max_concurrent=max_concurrent, application_name="pgflow demo worker"))
        for flow in chosen
    ]
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    started: list[Worker] = []
    try:
        refusals = []
        for worker in workers:
            try:
                worker.start()
                started.append(worker)
            except WorkerStartupError as exc:
                refusals.append(exc)
        if refusals:
            first = refusals[0]
            raise type(first)(
                f"{len(refusals)} of {len(workers)} demo worker(s) refused to start",
                hint=first.hint,
                detail=[exc.message for exc in refusals],
            )
        began = time.monotonic()
        bounded = stop_after is not None or until_idle
        served = {"flows": [w.flow.slug for w in workers]}
        with _connect(conninfo) as conn:
            while not stop.wait(min(maintenance_interval, 0.5) if bounded else maintenance_interval):
                conn.execute(sqlfiles.statement(QUERIES, "requeue_stalled"))
                if stop_after is not None and time.monotonic() - began >= stop_after:
                    break
                if until_idle and not db.scalar(conn.execute(sqlfiles.statement(QUERIES, "runs_in_flight"), served)):
                    break
            left = int(db.scalar(conn.execute(sqlfiles.statement(QUERIES, "runs_in_flight"), served)))
    finally:
        for worker in started:
            worker.stop("demo stopped")
        for worker in started:
            worker.join(60)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return left
