"""Re-measure every figure of docs/validation.md on one candidate and say which candidate it was.

Usage::

    .venv/bin/python bench/validation.py [--wheel FILE] [--only PART[,PART]] [--out FILE]

Parts, in order (each prints its command, its output's figures and ``uptime`` before and after):

* ``identity``: the candidate: version, git commit, the wheel's SHA-256 (``--wheel``, or built here
  with ``python -m build --wheel``; hatchling's wheels are reproducible, so the same tree gives
  the same digest), each migration's SHA-256 and whether it is released;
* ``code``: "Orchestration code removed and kept", ``python -m examples.ingest.measure --markdown``;
* ``starvation``: "Independent capacity and starvation", ``bench/run.py --only ingest_starvation
  --repeat 3`` (about 2 min);
* ``behaviour``: "Behaviour, each from a test" and "Retry and recovery gaps", ``pytest tests/validation``
  (about 4 min with ``-n 2``), with the figures the tests print (crash recovery, Retry-After gaps,
  workers per stage).

The figures go to stdout as one Markdown report, ready to compare with docs/validation.md; ``--out``
also writes them as JSON. Exit status 1 when a command failed (its output is in the report).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/validation.py` puts bench/ first, not the repository
    sys.path.insert(0, str(ROOT))

from bench.run import _git_commit  # noqa: E402
from pgflow_cli import __version__, installer  # noqa: E402

PARTS = ("identity", "code", "starvation", "behaviour")
PRINTED_FIGURE = re.compile(r"^(?:\S+: killed enrich task .*|retry ran .*|\S+: distinct workers per stage .*)$",
                            re.MULTILINE)
"""The lines tests/validation prints with the figures docs/validation.md quotes."""


def uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def run(command: list[str], timeout: float) -> tuple[int, str, float]:
    """``(exit status, output, seconds)`` of ``command`` run in the repository: its stdout, and its
    stderr too when it failed (progress lines otherwise)."""
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + (done.stderr if done.returncode else "")
    except subprocess.TimeoutExpired as expired:
        code, output = 124, f"timed out after {timeout:.0f} s\n{expired.stdout or ''}{expired.stderr or ''}"
    return code, output, time.monotonic() - started


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def identity(wheel: Path | None) -> dict[str, object]:
    """The candidate: version, commit, wheel digest, migration checksums."""
    if wheel is None:
        with tempfile.TemporaryDirectory(prefix="pgflow-validation-") as built:
            code, output, _ = run([sys.executable, "-m", "build", "--wheel", "--outdir", built, str(ROOT)], 600)
            if code != 0:
                raise SystemExit(f"python -m build failed:\n{output[-3000:]}")
            (made,) = Path(built).glob("*.whl")
            return {**identity(made), "wheel_built_here": True}
    found: dict[str, object] = {
        "version": __version__,
        "git_commit": _git_commit(),
        "wheel": wheel.name,
        "wheel_sha256": sha256(wheel),
        "wheel_built_here": False,
        "migrations": [{"migration": m.label, "sha256": m.checksum, "released": m.released}
                       for m in installer.available_migrations()],
    }
    if f"-{__version__}-" not in wheel.name:
        found["warning"] = f"the wheel is not version {__version__} of this tree"
    return found


def measure(part: str, wheel: Path | None) -> dict[str, object]:
    """One part of the report (:data:`PARTS`): its command, exit status, figures, load, seconds."""
    before = uptime()
    if part == "identity":
        started = time.monotonic()
        return {"part": part, "command": f"--wheel {wheel}" if wheel else "python -m build --wheel", "exit": 0,
                "identity": identity(wheel), "load_before": before, "load_after": uptime(),
                "seconds": round(time.monotonic() - started, 1)}
    if part == "code":
        command = [sys.executable, "-m", "examples.ingest.measure", "--markdown"]
        code, output, seconds = run(command, 120)
        figures = output.strip()
    elif part == "starvation":
        with tempfile.TemporaryDirectory(prefix="pgflow-validation-") as out:  # its JSON: the table is enough
            command = [sys.executable, "bench/run.py", "--only", "ingest_starvation", "--repeat", "3",
                       "--out", str(Path(out) / "starvation.json")]
            code, output, seconds = run(command, 1800)
        figures = output[output.find("| "):].strip() if code == 0 else output[-3000:]
    else:
        command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-rP", "-p", "no:cacheprovider", "tests/validation"]
        code, output, seconds = run(command, 1800)
        summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
        figures = "\n".join(PRINTED_FIGURE.findall(output) + summary[-1:]) if code == 0 else output[-5000:]
    return {"part": part, "command": " ".join(Path(c).name if c == sys.executable else c for c in command),
            "exit": code, "figures": figures, "load_before": before, "load_after": uptime(),
            "seconds": round(seconds, 1)}


def render(parts: list[dict[str, object]]) -> str:
    lines = ["# Validation figures", ""]
    for part in parts:
        lines += [f"## {part['part']}", "", f"`{part['command']}`: exit {part['exit']}, {part['seconds']} s; "
                  f"{part['load_before']} before, {part['load_after']} after", ""]
        if "identity" in part:
            found = part["identity"]
            assert isinstance(found, dict)
            lines += [f"* version: {found['version']}", f"* git commit: {found['git_commit']}",
                      f"* wheel: {found['wheel']}, SHA-256 {found['wheel_sha256']}"]
            if "warning" in found:
                lines.append(f"* **{found['warning']}**")
            lines += ["", "| migration | SHA-256 | released |", "| --- | --- | --- |"]
            lines += [f"| {m['migration']} | {m['sha256']} | {'yes' if m['released'] else 'no'} |"
                      for m in found["migrations"]]
        else:
            lines.append(str(part["figures"]))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/validation.py", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--wheel", type=Path, help="the candidate's wheel (default: build one from this tree)")
    parser.add_argument("--only", default="", help=f"comma-separated parts (default: all of {', '.join(PARTS)})")
    parser.add_argument("--out", type=Path, help="also write the report as JSON to this file")
    args = parser.parse_args(argv)
    wanted = [p.strip() for p in args.only.split(",") if p.strip()] or list(PARTS)
    unknown = sorted(set(wanted) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
    if args.wheel is not None and not args.wheel.is_file():
        parser.error(f"no wheel at {args.wheel}")
    parts = []
    for part in (p for p in PARTS if p in wanted):
        print(f"{part} ...", file=sys.stderr, flush=True)
        parts.append(measure(part, args.wheel))
    print(render(parts))
    if args.out:
        args.out.write_text(json.dumps(parts, indent=2) + "\n")
    return 1 if any(p["exit"] != 0 for p in parts) else 0


if __name__ == "__main__":
    sys.exit(main())
