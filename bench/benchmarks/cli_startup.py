"""CPU time of a ``pgflow`` process that does little: what importing the command line costs.

Each sample runs one fresh ``python -m pgflow_cli ...`` process and takes its CPU time (user +
system, from ``os.wait4``, children included); every round measures the baseline, a process that
only imports typer's ``typer.main`` (what the root command cannot do without), then each command once.
**Lower is better.** Measured:

* ``pgflow --help`` and ``pgflow --version``: the root alone; it imports no command module, neither
  psycopg nor rich (``pgflow_cli/cli/lazy.py``); issue 29's goal: under 0.15 s CPU;
* ``pgflow sandbox dsn``: reads the sandbox's server.json and asks ``pg_ctl status`` (a child process,
  counted); no psycopg, no rich, no pydantic; goal: under 0.15 s CPU. The bench's own server stands in
  for a running sandbox (``PGFLOW_SANDBOX_DIR``);
* ``pgflow audit --help`` and ``pgflow audit --print-sql``: one command's module and what it imports;
* database commands on a fresh database at the newest level, stdout piped (``plain``): ``status``,
  ``coverage``, ``runs list``, ``workers list``, ``migrate status``. Their CPU is the client's (the
  server's work is not in it); issue 29's goal: under 0.3 s CPU plus their queries.

No database is used but by the database commands. On the 2-core test machine (2026-12-01, load 3.0, 7
rounds, the tree before lazy loading measured in the same rounds): ``--help`` 6.6x the baseline before,
1.1x after; ``audit --help`` 8.4x before, 5.8x after; ``audit --print-sql`` 8.6x before, 5.5x after.
Issue 29's figures are in bench/README.md.
"""

from __future__ import annotations

import os
import subprocess
import sys

from bench.core import Context, Result

COMMANDS = {
    "pgflow --help": (["--help"], False),
    "pgflow --version": (["--version"], False),
    "pgflow sandbox dsn": (["sandbox", "dsn"], False),
    "pgflow audit --help": (["audit", "--help"], False),
    "pgflow audit --print-sql": (["audit", "--print-sql"], False),
    "pgflow status": (["status"], True),
    "pgflow coverage": (["coverage"], True),
    "pgflow runs list": (["runs", "list"], True),
    "pgflow workers list": (["workers", "list"], True),
    "pgflow migrate status": (["migrate", "status"], True),
}
"""name -> (the arguments after ``pgflow``, whether ``--dsn`` of a fresh newest-level database is added: no
flows there, what is measured is the process)."""
BASELINE = ["-c", "import typer.main"]


def _cpu_seconds(args: list[str], env: dict[str, str]) -> float:
    """User + system CPU milliseconds of one ``python ARGS`` process and its children (its output discarded;
    it must exit 0)."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, (args, proc.returncode)
    return (usage.ru_utime + usage.ru_stime) * 1000


def run(ctx: Context) -> list[Result]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
    env["PGFLOW_SANDBOX_DIR"] = str(ctx.server.base_dir)  # a running server: what `sandbox dsn` looks for
    with ctx.database("cli_startup") as conninfo:
        every = {name: ["-m", "pgflow_cli", *args, *(["--dsn", conninfo] if database else [])]
                 for name, (args, database) in COMMANDS.items()}
        baseline = Result("python -c 'import typer.main'", "ms CPU", [], work=1, details={"lower_is_better": True})
        measured = {name: Result(name, "ms CPU", [], work=1, baseline=baseline.name,
                                 details={"argv": ["python", *args[:4]], "lower_is_better": True})
                    for name, args in every.items()}
        for _ in range(ctx.size(3, minimum=1)):  # warm the file cache and the bytecode caches, not timed
            for args in (BASELINE, *every.values()):
                _cpu_seconds(args, env)
        for sample in range(max(ctx.repeat, 5)):  # one baseline sample, then each command, per round
            baseline.samples.append(_cpu_seconds(BASELINE, env))
            for name, args in every.items():
                measured[name].samples.append(_cpu_seconds(args, env))
            ctx.log(f"sample {sample + 1}: " + ", ".join(f"{n} {r.samples[-1]:.0f} ms" for n, r in measured.items()))
    return [baseline, *measured.values()]
