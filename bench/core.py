"""What a benchmark module gets (:class:`Context`) and returns (:class:`Result`).

A benchmark is a module ``bench/benchmarks/<name>.py`` with a function ``run(ctx) -> list[Result]``.
It measures each quantity ``ctx.repeat`` times and reports the samples; the runner computes
median, min, max and spread, and the ratio of every result to its ``baseline`` result (another
result of the same module, measured in the same run on the same server).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pgflow_cli import installer
from pgflow_cli.sandbox import LocalServer


@dataclass
class Result:
    """One measured quantity.

    Attributes:
        benchmark: module name (filled in by the runner when left empty).
        name: what was measured, e.g. ``"reference worker, 3-step flow"``.
        unit: e.g. ``"runs/s"``; higher is better for every rate.
        samples: one value per repetition.
        work: units of work per sample (e.g. runs or messages), for the table.
        baseline: ``name`` of the result in the same benchmark this one is compared with.
        details: free-form settings (batch sizes, concurrency...), saved in the JSON.
    """

    name: str
    unit: str
    samples: list[float]
    work: int = 0
    baseline: str | None = None
    benchmark: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread_pct(self) -> float:
        """(max - min) / median, in percent."""
        return 100.0 * (max(self.samples) - min(self.samples)) / self.median if self.median else 0.0


class Context:
    """Handed to every benchmark's ``run(ctx)``.

    Attributes:
        server: the private :class:`LocalServer` of this bench run.
        repeat: how many times to measure each quantity.
        scale: multiply your default work sizes by this (``--scale``); see :meth:`size`.
        prefix: starts the name of every database this context makes (two contexts share a server).
        statements_context: a context on a server that loads pg_stat_statements, kept for the whole
            run, that :func:`statements_server` hands out instead of starting a server (bench/ab.py).
    """

    def __init__(self, server: LocalServer, *, repeat: int, scale: float, prefix: str = "b") -> None:
        self.server = server
        self.repeat = repeat
        self.scale = scale
        self.prefix = prefix
        self.statements_context: Context | None = None
        self._admin = psycopg.connect(server.conninfo("postgres"), autocommit=True)
        self._templates: dict[int | None, str] = {}
        self._counter = itertools.count(1)

    def size(self, default: int, minimum: int = 10) -> int:
        """A work size: ``default`` times ``--scale``, at least ``minimum``."""
        return max(minimum, int(default * self.scale))

    def log(self, message: str) -> None:
        """Progress line on stderr (the results table goes to stdout)."""
        print(f"  {message}", file=sys.stderr, flush=True)

    def conninfo(self, dbname: str) -> str:
        return self.server.conninfo(dbname)

    def template(self, schema: int | None = None) -> str:
        """Name of the template database with PGMQ and the migrations up to ``schema`` (all: ``None``)."""
        if schema not in self._templates:
            name = "bench_template" if schema is None else f"bench_template_{schema:04d}"
            name = name if self.prefix == "b" else f"{self.prefix}_{name}"
            self._admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            self._admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            self.install(self.conninfo(name), schema)
            self._templates[schema] = name
        return self._templates[schema]

    def install(self, conninfo: str, schema: int | None) -> None:
        """Install PGMQ and the migrations up to ``schema`` into the empty database ``conninfo``."""
        with psycopg.connect(conninfo, autocommit=True) as conn:
            installer.install(conn, target=schema)

    @contextlib.contextmanager
    def database(self, label: str, *, schema: int | None = None) -> Iterator[str]:
        """A fresh database with PGMQ and the pgflow migrations up to ``schema`` (default: all),
        dropped afterwards; yields its conninfo."""
        template = self.template(schema)
        name = f"{self.prefix}{next(self._counter)}_{label}"[:60]
        self._admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
        try:
            yield self.conninfo(name)
        finally:
            self._admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def close(self) -> None:
        self._admin.close()


STATEMENTS_SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.track": "'top'",
    "pg_stat_statements.max": "5000",
}
"""A server that counts statements: top-level ones only (a function call counts once, with its body)."""


@contextlib.contextmanager
def statements_server(ctx: Context, label: str) -> Iterator[Context]:
    """A private server of its own with pg_stat_statements loaded (the shared bench server does not
    load it), as a :class:`Context` with the same repeat and scale; stopped and deleted afterwards.
    Each database made on it needs ``CREATE EXTENSION pg_stat_statements``. When ``ctx`` names one
    already (``ctx.statements_context``: bench/ab.py keeps one for both trees), that one is used."""
    if ctx.statements_context is not None:
        yield ctx.statements_context
        return
    base = Path(tempfile.mkdtemp(prefix="pgflow-bench-pgss-", dir="/tmp"))
    os.chmod(base, 0o755)  # the server may run as the 'postgres' user
    server = LocalServer(base / "pg", settings=STATEMENTS_SETTINGS)
    own: Context | None = None
    try:
        ctx.log(f"{label}: starting a server with pg_stat_statements")
        server.start()
        server.wait_ready()
        own = Context(server, repeat=ctx.repeat, scale=ctx.scale)
        yield own
    finally:
        if own is not None:
            own.close()
        server.destroy()
        shutil.rmtree(base, ignore_errors=True)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, fn())`` with a monotonic clock."""
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def start_run(conn: psycopg.Connection, flow_slug: str, run_input: Any) -> str:
    """Start one run of ``flow_slug`` (``pgflow.start_flow``) on ``conn``; returns its run id."""
    row = conn.execute("SELECT run_id FROM pgflow.start_flow(%s, %s)", (flow_slug, Jsonb(run_input))).fetchone()
    assert row is not None
    return str(row[0])


def wait_run_ended(conn: psycopg.Connection, run_id: str) -> None:
    """Return once the run is no longer ``started`` (checked every 10 ms: the timing resolution)."""
    while conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone() == ("started",):
        time.sleep(0.01)


def alternate(ctx: Context, label: str, first: Callable[[], float], second: Callable[[], float],
              describe: Callable[[float, float], str]) -> tuple[list[float], list[float]]:
    """Measure ``first`` and ``second`` alternately (first, second, first, ...), ``ctx.repeat`` times
    each, logging ``describe(first_value, second_value)`` after every pair; returns both lists."""
    a: list[float] = []
    b: list[float] = []
    for i in range(ctx.repeat):
        a.append(first())
        b.append(second())
        ctx.log(f"{label} {i + 1}/{ctx.repeat}: {describe(a[-1], b[-1])}")
    return a, b
