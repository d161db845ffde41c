"""Run every benchmark and print one table with the machine's details.

Usage::

    .venv/bin/python bench/run.py [--repeat N] [--scale F] [--only NAME[,NAME]] [--out FILE]
    .venv/bin/python -m bench ...

Starts a private PostgreSQL server (pgflow_cli.sandbox.LocalServer, the same code as the
test harness and ``pgflow sandbox``) in a temporary directory, installs PGMQ and the pgflow
schema with pgflow_cli.installer into a template database, runs each module of
bench/benchmarks/ (a fresh database per measurement), prints the results table on stdout and
writes bench/results/<timestamp>.json. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/run.py` puts bench/ first, not the repository
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from tabulate import tabulate  # noqa: E402

import bench.benchmarks  # noqa: E402
from bench.core import Context, Result  # noqa: E402
from pgflow_cli import __version__, installer  # noqa: E402
from pgflow_cli.sandbox import FAST_SETTINGS, LocalServer  # noqa: E402
from pgflow_cli.worker.protocol import LATEST  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
JSON_VERSION = 1


def discover() -> list[str]:
    """Benchmark module names in bench/benchmarks/, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(bench.benchmarks.__path__) if not m.name.startswith("_"))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _git_commit() -> str | None:
    if not shutil.which("git"):
        return None
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine_details(server: LocalServer, settings: dict[str, str] | None = None) -> dict:
    """CPU, cores, memory, PostgreSQL, PGMQ, Python, and what was measured (``settings``: the server
    settings given with ``--server-setting``)."""
    with psycopg.connect(server.conninfo("bench_template")) as conn:
        pg_version = conn.execute("SELECT current_setting('server_version')").fetchone()[0]
        protocol = conn.execute("SELECT pgflow.protocol_version()").fetchone()[0]
        schema = conn.execute("SELECT max(version) FROM pgflow.schema_migrations").fetchone()[0]
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": affinity,
        "memory_gib": _memory_gib(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "os": platform.platform(),
        "python": platform.python_version(),
        "postgresql": pg_version,
        "postgresql_settings": {**{k: v for k, v in FAST_SETTINGS.items() if k in ("fsync", "synchronous_commit",
                                                                                     "shared_buffers")}, **(settings or {})},
        "pgmq": installer.bundled_pgmq_sql()[0] + " (SQL install)",
        "pgflow_cli": __version__,
        "schema_version": schema,
        "protocol": {"database": protocol, "worker": LATEST.version},
        "git_commit": _git_commit(),
    }


def _baseline(results: list[Result], r: Result) -> Result | None:
    return next((b for b in results if b.benchmark == r.benchmark and b.name == r.baseline), None)


def paired_ratio(r: Result, base: Result) -> float | None:
    """Median of sample-by-sample ratios (samples were interleaved, so each pair shares the machine's mood)."""
    if len(r.samples) != len(base.samples):
        return None
    return statistics.median(a / b for a, b in zip(r.samples, base.samples, strict=True))


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def render(results: list[Result], machine: dict, seconds: float) -> str:
    rows = []
    for r in results:
        base = _baseline(results, r)
        paired = paired_ratio(r, base) if base else None
        rows.append([
            r.benchmark,
            r.name,
            f"{_fmt(r.median)} {r.unit}",
            f"{_fmt(min(r.samples))} - {_fmt(max(r.samples))}",
            f"{r.spread_pct:.0f}%",
            len(r.samples),
            r.work,
            f"{r.median / base.median:.2f}x (paired {paired:.2f}x) of {base.name}" if base else "baseline" if any(
                x.baseline == r.name for x in results if x.benchmark == r.benchmark) else "",
        ])
    table = tabulate(rows, headers=["benchmark", "measurement", "median", "min - max", "spread", "n", "work/sample",
                                    "ratio"], tablefmt="github")
    m = machine
    head = [
        f"pgflow-cli {m['pgflow_cli']} ({m['git_commit'] or 'no git'}), schema {m['schema_version']}, "
        f"protocol db {m['protocol']['database']} / worker {m['protocol']['worker']}",
        f"CPU: {m['cpu_model']}, {m['cpu_cores']} cores ({m['cpu_cores_usable']} usable), "
        f"memory {m['memory_gib']} GiB, load at start {m['load_average_at_start']}",
        f"PostgreSQL {m['postgresql']} (private server, {', '.join(f'{k}={v}' for k, v in m['postgresql_settings'].items())}), "
        f"PGMQ {m['pgmq']}, Python {m['python']}, {m['os']}",
    ]
    foot = (f"spread = (max - min) / median; ratio = median / baseline median; paired = median of per-repetition "
            f"ratios (baseline and measurement interleaved); all measured in this run on this server. Total {seconds:.0f}s.")
    return "\n".join(head) + "\n\n" + table + "\n\n" + foot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run.py", description="Run every pgflow-cli benchmark.")
    parser.add_argument("--repeat", type=int, default=5, help="measurements per quantity (median reported; default 5)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every work size (default 1.0)")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default bench/results/<timestamp>.json)")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--server-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a postgresql.conf setting of the private server, e.g. shared_buffers=1GB (repeatable; "
                             "shown with the machine's details)")
    args = parser.parse_args(argv)
    settings = {}
    for item in args.server_setting:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            parser.error(f"--server-setting takes NAME=VALUE, got {item!r}")
        settings[name.strip()] = value.strip()

    names = discover()
    if args.list:
        print("\n".join(names))
        return 0
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(names)}")
        names = [n for n in names if n in wanted]
    if args.repeat < 1 or args.scale <= 0:
        parser.error("--repeat must be at least 1 and --scale positive")

    def stop(signum: int, frame: object) -> None:
        # a SIGTERM or SIGHUP (a CI timeout, a closed terminal) unwinds like Ctrl-C, so each benchmark's
        # worker processes and the private server are stopped and its directory removed
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for terminating in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(terminating, stop)

    started = time.monotonic()
    stamp = datetime.now(timezone.utc)
    base = Path(tempfile.mkdtemp(prefix="pgflow-bench-", dir="/tmp"))
    os.chmod(base, 0o755)  # the server may run as the 'postgres' user
    server = LocalServer(base / "pg", settings=settings)
    ctx: Context | None = None
    results: list[Result] = []
    try:
        print(f"starting a private PostgreSQL server in {base} ...", file=sys.stderr, flush=True)
        server.start()
        server.wait_ready()
        ctx = Context(server, repeat=args.repeat, scale=args.scale)
        ctx.template()  # install once, before anything is timed
        machine = machine_details(server, settings)
        for name in names:
            print(f"{name}:", file=sys.stderr, flush=True)
            module = importlib.import_module(f"bench.benchmarks.{name}")
            for result in module.run(ctx):
                result.benchmark = result.benchmark or name
                results.append(result)
    finally:
        if ctx is not None:
            ctx.close()
        server.destroy()
        shutil.rmtree(base, ignore_errors=True)

    seconds = time.monotonic() - started
    print(render(results, machine, seconds))
    document = {
        "version": JSON_VERSION,
        "started_at": stamp.isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "settings": {"repeat": args.repeat, "scale": args.scale, "benchmarks": names, "server_settings": settings},
        "machine": machine,
        "results": [
            {
                "benchmark": r.benchmark, "name": r.name, "unit": r.unit, "work_per_sample": r.work,
                "samples": [round(s, 3) for s in r.samples], "median": round(r.median, 3),
                "min": round(min(r.samples), 3), "max": round(max(r.samples), 3),
                "spread_pct": round(r.spread_pct, 1), "baseline": r.baseline,
                "ratio": round(r.median / b.median, 4) if (b := _baseline(results, r)) else None,
                "paired_ratio": round(p, 4) if b and (p := paired_ratio(r, b)) is not None else None,
                "details": r.details,
            }
            for r in results
        ],
    }
    out = args.out or RESULTS_DIR / f"{stamp.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nresults written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stopped:
        # the server and the benchmarks' processes are gone by now (main's cleanup ran); nothing is written
        print(f"bench/run.py: stopped ({stopped or 'Ctrl-C'}); no results written", file=sys.stderr)
        sys.exit(130)
