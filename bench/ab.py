"""Interleaved A/B: benchmarks run against the SQL of two trees, alternating, on one server.

Usage::

    .venv/bin/python bench/ab.py --before /path/to/other/tree [--only end_to_end,claim,server_time]
                                 [--rounds 3] [--repeat 1] [--scale 1.0] [--out FILE]

"before" is the other tree (a worktree of the commit to compare with); "after" is this one. Each
tree installs PGMQ and its own migrations into its own template databases: this tree in-process,
the other through its own Python (``--before-python``, by default ``<tree>/.venv/bin/python``, an
environment with that tree installed), so each side is exactly what its ``migrate apply`` builds.
Both sides share one private server (and one server that loads pg_stat_statements, for the
modules that need it, instead of one per module run). Every benchmark module runs once per round
for each side, ``--repeat`` samples each time, the sides alternating (before, after; then after,
before; ...), so a change of the machine's load falls on both. The Python that drives the
benchmarks (the reference worker, the protocol client) is this tree's for both sides: only the SQL
differs.

Output (stdout): per measurement, each side's median and its ratio to its own baseline (the ratio
``bench/run.py`` reports, from samples of the same module run), the after/before quotient of those
ratios (the change of the ratio; paired: the median of the per-round quotients), and whether the
ratio got worse by more than ``--tolerance`` (default 5%; "worse" is lower for a rate, higher for a
time marked lower-is-better). The load average before and after every module run is printed and
kept in the JSON (``bench/results/ab-<timestamp>.json`` unless ``--out``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/ab.py` puts bench/ first, not the repository
    sys.path.insert(0, str(ROOT))

from tabulate import tabulate  # noqa: E402

from bench.core import STATEMENTS_SETTINGS, Context, Result  # noqa: E402
from bench.run import RESULTS_DIR, discover  # noqa: E402
from pgflow_cli.sandbox import LocalServer  # noqa: E402

INSTALL = """
import sys
import psycopg
from pgflow_cli import installer
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    installer.install(conn, target=int(sys.argv[2]) if sys.argv[2] else None)
"""
"""What the other tree's Python runs to fill a template database."""

SIDES = ("before", "after")


class TreeContext(Context):
    """A :class:`Context` whose templates hold one tree's migrations (``python``: ``None`` for this tree)."""

    def __init__(self, server: LocalServer, *, repeat: int, scale: float, prefix: str, python: Path | None,
                 tree: Path) -> None:
        super().__init__(server, repeat=repeat, scale=scale, prefix=prefix)
        self.python = python
        self.tree = tree

    def install(self, conninfo: str, schema: int | None) -> None:
        if self.python is None:
            super().install(conninfo, schema)
            return
        subprocess.run([str(self.python), "-c", INSTALL, conninfo, "" if schema is None else str(schema)],
                       cwd=self.tree, check=True)


def _lower_is_better(result: Result) -> bool:
    return bool(result.details.get("lower_is_better"))


def _ratio(results: list[Result], result: Result) -> tuple[float, float] | None:
    """(median ratio, paired ratio) of ``result`` to its baseline among ``results`` (one module run)."""
    base = next((b for b in results if b.name == result.baseline), None)
    if base is None:
        return None
    paired = statistics.median(a / b for a, b in zip(result.samples, base.samples, strict=False))
    return result.median / base.median, paired


def summarize(rounds: list[dict[str, dict[str, list[Result]]]], tolerance: float) -> list[dict]:
    """One row per measurement: both sides' medians and baseline ratios, and the change of the ratio."""
    rows = []
    first = rounds[0]["after"]
    for benchmark, results in first.items():
        for result in results:
            row: dict = {"benchmark": benchmark, "name": result.name, "unit": result.unit,
                         "lower_is_better": _lower_is_better(result), "baseline": result.baseline}
            per_round: list[float] = []
            for side in SIDES:
                samples, ratios = [], []
                for one in rounds:
                    mine = next(r for r in one[side][benchmark] if r.name == result.name)
                    samples += mine.samples
                    ratio = _ratio(one[side][benchmark], mine)
                    if ratio is not None:
                        ratios.append(ratio[0])
                row[f"{side}_median"] = statistics.median(samples)
                row[f"{side}_samples"] = samples
                row[f"{side}_ratio"] = statistics.median(ratios) if ratios else None
                row[f"{side}_round_ratios"] = ratios
            if row["after_ratio"] is not None:
                per_round = [a / b for a, b in zip(row["after_round_ratios"], row["before_round_ratios"], strict=True)]
                change = row["after_ratio"] / row["before_ratio"]
                paired = statistics.median(per_round)
            else:  # a baseline itself: compare the values
                change = row["after_median"] / row["before_median"]
                paired = statistics.median(
                    a / b for a, b in zip(row["after_samples"], row["before_samples"], strict=True))
            worse = (change - 1) if row["lower_is_better"] else (1 - change)
            row.update(change=change, paired_change=paired,
                       verdict=("worse by %.1f%%" % (100 * worse)) if worse > tolerance else "ok")
            rows.append(row)
    return rows


def render(rows: list[dict], loads: list[dict], seconds: float, tolerance: float) -> str:
    table = []
    def cell(row: dict, side: str) -> str:
        ratio = row[f"{side}_ratio"]
        return f"{row[f'{side}_median']:,.1f}" + (f" ({ratio:.3f}x)" if ratio is not None else "")

    for row in rows:
        what = "ratio after/before" if row["after_ratio"] is not None else "value after/before"
        table.append([row["benchmark"], row["name"], row["unit"] + (" (lower is better)" if row["lower_is_better"] else ""),
                      cell(row, "before"), cell(row, "after"),
                      f"{row['change']:.3f} (paired {row['paired_change']:.3f}) {what}", row["verdict"]])
    text = tabulate(table, headers=["benchmark", "measurement", "unit", "before (x baseline)", "after (x baseline)",
                                    "change", f"worse > {tolerance:.0%}?"], tablefmt="github")
    load_lines = [f"  round {x['round']} {x['side']:6} {x['benchmark']:12} load {x['load_before']} -> {x['load_after']}"
                  for x in loads]
    return (text + "\n\nload average (1, 5, 15 min) around each module run:\n" + "\n".join(load_lines)
            + f"\n\nTotal {seconds:.0f}s. Each side's ratio is to its own baseline, measured in the same module run;"
            " change = after ratio / before ratio (for a baseline row: after value / before value).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/ab.py", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--before", type=Path, required=True, help="the other tree (a worktree of the commit before)")
    parser.add_argument("--before-python", type=Path, default=None,
                        help="a Python with the other tree installed (default: <tree>/.venv/bin/python)")
    parser.add_argument("--only", default="end_to_end,claim,server_time", help="comma-separated benchmark names")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (before, after) module runs (default 3)")
    parser.add_argument("--repeat", type=int, default=1, help="samples per module run (default 1)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every work size (default 1.0)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="a ratio this much worse is flagged (0.05)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default bench/results/ab-<timestamp>.json)")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(discover()))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}")
    before_python = args.before_python or args.before / ".venv" / "bin" / "python"
    if not (args.before / "sql" / "migrations").is_dir() or not before_python.exists():
        parser.error(f"{args.before} is not a tree with sql/migrations and {before_python}")
    if args.rounds < 1 or args.repeat < 1 or args.scale <= 0:
        parser.error("--rounds and --repeat must be at least 1 and --scale positive")

    started = time.monotonic()
    stamp = datetime.now(timezone.utc)
    base = Path(tempfile.mkdtemp(prefix="pgflow-bench-ab-", dir="/tmp"))
    os.chmod(base, 0o755)  # the server may run as the 'postgres' user
    servers = [LocalServer(base / "pg"), LocalServer(base / "pgss", settings=STATEMENTS_SETTINGS)]
    contexts: dict[str, TreeContext] = {}
    rounds: list[dict[str, dict[str, list[Result]]]] = []
    loads: list[dict] = []
    try:
        for server in servers:
            server.start()
            server.wait_ready()
        for side, python, tree in (("before", before_python, args.before), ("after", None, ROOT)):
            ctx = TreeContext(servers[0], repeat=args.repeat, scale=args.scale, prefix=side[0], python=python,
                              tree=tree)
            ctx.statements_context = TreeContext(servers[1], repeat=args.repeat, scale=args.scale, prefix=side[0],
                                                 python=python, tree=tree)
            contexts[side] = ctx
        for number in range(1, args.rounds + 1):
            order = SIDES if number % 2 else tuple(reversed(SIDES))
            one: dict[str, dict[str, list[Result]]] = {side: {} for side in SIDES}
            for name in names:
                module = importlib.import_module(f"bench.benchmarks.{name}")
                for side in order:
                    load_before = [round(x, 2) for x in os.getloadavg()]
                    print(f"round {number}/{args.rounds}: {name} ({side})", file=sys.stderr, flush=True)
                    one[side][name] = module.run(contexts[side])
                    loads.append({"round": number, "side": side, "benchmark": name, "load_before": load_before,
                                  "load_after": [round(x, 2) for x in os.getloadavg()]})
            rounds.append(one)
    finally:
        for ctx in contexts.values():
            if ctx.statements_context is not None:
                ctx.statements_context.close()
            ctx.close()
        for server in servers:
            server.destroy()
        shutil.rmtree(base, ignore_errors=True)

    seconds = time.monotonic() - started
    rows = summarize(rounds, args.tolerance)
    print(f"A/B: before = {args.before}, after = {ROOT}; {args.rounds} rounds x {args.repeat} sample(s), "
          f"scale {args.scale}; load at start {loads[0]['load_before']}")
    print(render(rows, loads, seconds, args.tolerance))
    out = args.out or RESULTS_DIR / f"ab-{stamp.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"started_at": stamp.isoformat(timespec="seconds"), "seconds": round(seconds, 1),
                               "before": str(args.before), "after": str(ROOT), "rounds": args.rounds,
                               "repeat": args.repeat, "scale": args.scale, "loads": loads, "rows": rows},
                              indent=2) + "\n")
    print(f"\nresults written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
