"""CPU time of a ``pgflow`` process that does little: what importing the command line costs.

Each sample runs one fresh ``python -m pgflow_cli ...`` process and takes its CPU time (user +
system, from ``os.wait4``); every round measures the baseline, a process that only imports typer's
``typer.main`` (what the root command cannot do without), then each command once. **Lower is better.** Measured:

* ``pgflow --help``: the root alone; it imports no command module, neither psycopg nor rich
  (``pgflow_cli/cli/lazy.py``);
* ``pgflow audit --help``: one command's module and what it imports (psycopg, rich, its operation);
* ``pgflow audit --print-sql``: the same command doing its (database-free) work.

No database is used. On the 2-core test machine (2026-12-01, load 3.0, 7 rounds, the tree before
lazy loading measured in the same rounds): ``--help`` 6.6x the baseline before, 1.1x after; ``audit
--help`` 8.4x before, 5.8x after; ``audit --print-sql`` 8.6x before, 5.5x after.
"""

from __future__ import annotations

import os
import subprocess
import sys

from bench.core import Context, Result

COMMANDS = {
    "pgflow --help": ["-m", "pgflow_cli", "--help"],
    "pgflow audit --help": ["-m", "pgflow_cli", "audit", "--help"],
    "pgflow audit --print-sql": ["-m", "pgflow_cli", "audit", "--print-sql"],
}
BASELINE = ["-c", "import typer.main"]


def _cpu_seconds(args: list[str]) -> float:
    """User + system CPU seconds of one ``python ARGS`` process (its output discarded; it must exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, (args, proc.returncode)
    return usage.ru_utime + usage.ru_stime


def run(ctx: Context) -> list[Result]:
    baseline = Result("python -c 'import typer.main'", "s CPU", [], work=1, details={"lower_is_better": True})
    measured = {name: Result(name, "s CPU", [], work=1, baseline=baseline.name,
                             details={"argv": ["python", *args], "lower_is_better": True})
                for name, args in COMMANDS.items()}
    for _ in range(ctx.size(3, minimum=1)):  # warm the file cache and the bytecode caches, not timed
        for args in (BASELINE, *COMMANDS.values()):
            _cpu_seconds(args)
    for sample in range(max(ctx.repeat, 5)):  # one baseline sample, then each command, per round
        baseline.samples.append(_cpu_seconds(BASELINE))
        for name, args in COMMANDS.items():
            measured[name].samples.append(_cpu_seconds(args))
        ctx.log(f"sample {sample + 1}: " + ", ".join(f"{n} {r.samples[-1]:.3f}s" for n, r in measured.items()))
    return [baseline, *measured.values()]
