"""The release artifacts: `python -m build` makes an sdist and a wheel, and the wheel alone, installed
into a fresh virtual environment (not editable, from another directory, the repository nowhere on
``sys.path``), runs the operator quickstart of README.md: a sandbox, the audit, ``migrate plan``,
``migrate apply``, ``migrate status`` and ``status``.

The artifacts are built once per test session (docs/releasing.md builds them the same way); pip
installs the wheel's dependencies as an operator's pip would, from the configured index (its cache
makes that quick on a machine that installed the project's venv).
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import pgflow_cli

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Artifacts:
    wheel: Path
    sdist: Path


@dataclass(frozen=True)
class Installed:
    """A virtual environment holding only the wheel (with its ``binary`` extra) and its dependencies."""

    venv: Path
    workdir: Path
    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=300)

    def pgflow(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "pgflow"), *args)

    def json(self, *args: str, code: int = 0) -> dict:
        done = self.pgflow(*args, "--format", "json")
        assert done.returncode == code, (args, done.returncode, done.stdout[-3000:], done.stderr[-3000:])
        assert "Traceback" not in done.stderr, done.stderr
        return json.loads(done.stdout)


def _tracked(under: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", under], cwd=REPO, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name]


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Artifacts:
    out = tmp_path_factory.mktemp("dist")
    # the default build: the sdist first, then the wheel built from the unpacked sdist, so a file the
    # sdist forgets is missing from the wheel too
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Artifacts(wheel, sdist)


@pytest.fixture(scope="session")
def installed(artifacts, tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("wheel-only")
    venv, workdir, home = base / "venv", base / "elsewhere", base / "home"
    workdir.mkdir()
    home.mkdir()
    # a fresh venv of the interpreter the tests run on, without this run's site-packages
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    ours = {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}
    path = os.pathsep.join([str(venv / "bin")] + [p for p in os.environ.get("PATH", "").split(os.pathsep)
                                                 if p and p not in ours])
    pip_env = {k: v for k, v in os.environ.items() if k.startswith(("PIP_", "PYENV", "XDG_CACHE"))}
    # pip keeps the machine's own HOME (its configuration and cache); pgflow gets a home of its own
    pip_env.update(PATH=path, HOME=os.environ.get("HOME", str(home)))
    # a current pip first (docs/releasing.md): pip before 25.1 shows no License-Expression
    for args in (["install", "-q", "--upgrade", "pip>=25.1"], ["install", "-q", f"{artifacts.wheel}[binary]"]):
        done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", *args], cwd=workdir, env=pip_env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", "COLUMNS": "120"}
    return Installed(venv, workdir, env)


def test_the_wheel_carries_the_sql_and_nothing_of_the_repository_s_tests(artifacts):
    names = set(zipfile.ZipFile(artifacts.wheel).namelist())
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"pgflow_cli", artifacts.wheel.name.split("-py3")[0] + ".dist-info"}, tops
    sql = _tracked("sql")
    assert len(sql) > 100
    missing = [name for name in sql if f"pgflow_cli/{name}" not in names]
    assert not missing, f"the wheel lacks {missing[:5]}: pgflow_cli.sqlfiles reads them at run time"
    shipped_sql = {name for name in names if name.startswith("pgflow_cli/sql/")}
    assert shipped_sql == {f"pgflow_cli/{name}" for name in sql}, "the wheel's SQL is exactly the repository's sql/"
    package = set(_tracked("pgflow_cli"))
    assert package <= names, sorted(package - names)[:5]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # the dist-info carries the license text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    with tarfile.open(artifacts.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    for needed in ("pyproject.toml", "LICENSE", "README.md", "CHANGELOG.md", "tests/conftest.py",
                   "scripts/regenerate_migration.py", *sql):
        assert needed in members, f"the sdist lacks {needed}"


def test_the_wheel_s_metadata_is_complete(artifacts, installed):
    with zipfile.ZipFile(artifacts.wheel) as wheel:
        (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(wheel.read(name).decode())
    assert metadata["Name"] == "pgflow-cli"
    assert metadata["Version"] == pgflow_cli.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Requires-Python"] == ">=3.10"
    assert metadata.get_all("Project-URL"), "no project URL"
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3.10" in classifiers and "Topic :: Database" in classifiers
    assert metadata["Summary"] and metadata["Description-Content-Type"] == "text/markdown"
    assert "psycopg[binary]" in " ".join(metadata.get_all("Requires-Dist"))

    shown = installed.run(str(installed.venv / "bin" / "pip"), "show", "--verbose", "pgflow-cli")
    assert shown.returncode == 0, shown.stderr
    fields = dict(line.split(": ", 1) for line in shown.stdout.splitlines() if ": " in line)
    assert fields["Version"] == pgflow_cli.__version__
    assert fields["Location"].startswith(str(installed.venv)), fields["Location"]
    assert "Editable project location" not in fields
    assert fields["License-Expression"] == "Apache-2.0" and fields["Author"], fields
    assert "Classifiers:" in shown.stdout and "Project-URLs:" in shown.stdout, shown.stdout


def test_the_installed_wheel_runs_the_operator_quickstart(installed):
    # the package and its SQL come from the venv, not from a checkout
    where = installed.run(str(installed.venv / "bin" / "python"), "-c",
                          "import sys, pgflow_cli; from pgflow_cli import sqlfiles; "
                          "print(pgflow_cli.__file__); print(sqlfiles.sql_root()); print('\\n'.join(sys.path))")
    assert where.returncode == 0, where.stderr
    module, sql_root, *sys_path = where.stdout.splitlines()
    assert module.startswith(str(installed.venv)) and sql_root.startswith(str(installed.venv)), where.stdout
    assert not [p for p in sys_path if p and Path(p).resolve().is_relative_to(REPO)], sys_path
    version = installed.pgflow("--version")
    assert version.returncode == 0 and pgflow_cli.__version__ in version.stdout, version

    sandbox = Path(tempfile.mkdtemp(prefix="pgflow-rel-", dir="/tmp"))  # short (socket path), postgres-readable
    os.chmod(sandbox, 0o755)
    installed.env["PGFLOW_SANDBOX_DIR"] = str(sandbox / "sandbox")
    try:
        _quickstart(installed)
    finally:
        installed.pgflow("sandbox", "reset", "--destroy", "--yes")
        installed.env.pop("PGFLOW_SANDBOX_DIR")
        subprocess.run(["rm", "-rf", str(sandbox)], check=False)


def _quickstart(installed: Installed) -> None:
    """README "On the sandbox" (the demo refuses the upgrade), then "On your own PostgreSQL" on a
    new database of the sandbox's server (installs PGMQ and every migration)."""
    up = installed.json("sandbox", "up", "--seed", "demo")
    assert up["schema_version"] == 2 and up["pending_migrations"] == 1 and up["flows"] > 0, up
    audit = installed.json("audit", "--sandbox", code=1)
    assert audit["summary"]["blocking"] > 0 and audit["summary"]["exit_code"] == 1, audit["summary"]
    refused = installed.json("migrate", "plan", "--sandbox", code=1)
    assert refused["refused"]["error"] == "Refused" and [m["version"] for m in refused["pending"]] == [3], refused

    conninfo = installed.json("sandbox", "status")["conninfo"]
    created = installed.run(str(installed.venv / "bin" / "python"), "-c",
                            "import sys, psycopg; psycopg.connect(sys.argv[1], autocommit=True)"
                            ".execute('CREATE DATABASE wheel_fresh')", conninfo)
    assert created.returncode == 0, created.stderr
    dsn = conninfo.replace("dbname=pgflow", "dbname=wheel_fresh")
    assert dsn != conninfo

    migrations = sorted(installed.venv.glob("lib/python*/site-packages/pgflow_cli/sql/migrations/*.sql"))
    versions = [int(p.name[:4]) for p in migrations]
    assert versions == list(range(1, len(versions) + 1)) and len(versions) >= 3

    plan = installed.json("migrate", "plan", "--dsn", dsn)
    assert [m["version"] for m in plan["pending"]] == versions and plan["pgmq_installed"] is False, plan
    applied = installed.json("migrate", "apply", "--install-pgmq", "--dsn", dsn)
    assert applied["applied"] == [p.stem for p in migrations] and applied["dry_run"] is False, applied
    status = installed.json("migrate", "status", "--dsn", dsn)
    assert status["verdict"] == "up_to_date" and status["pending"] == [] and status["changed"] == [], status
    ledger = {m["version"]: m for m in status["migrations"]}
    for path in migrations:
        entry = ledger[int(path.name[:4])]
        assert entry["state"] == "applied", entry
        assert entry["checksum"] == hashlib.sha256(path.read_bytes()).hexdigest(), entry
        assert entry["tool_version"] == pgflow_cli.__version__, entry
    assert {f["state"] for f in status["files"]} == {"current"}, status["files"]
    clean = installed.json("audit", "--dsn", dsn)
    assert clean["summary"]["blocking"] == 0 and clean["summary"]["exit_code"] == 0, clean["summary"]
    overview = installed.json("status", "--dsn", dsn)
    assert overview["totals"]["flows"] == 0 and overview["totals"]["runs_in_flight"] == 0, overview["totals"]
