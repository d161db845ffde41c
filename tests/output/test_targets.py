"""Issue 16 item 1: the banner and the JSON ``database`` object describe the server actually connected to,
for a URL, key=value, PG* variables and libpq service files (``service=`` and ``PGSERVICE``)."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from psycopg.conninfo import conninfo_to_dict

from pgflow_cli.errors import ExitCode
from tests.support.cli import run_cli
from tests.support.schemas import validate


def _parts(database) -> dict[str, str]:
    params = conninfo_to_dict(database.conninfo)
    return {key: str(params[key]) for key in ("host", "port", "user", "dbname")}


@pytest.fixture
def service_file(tmp_path, db):
    """A real pg_service.conf naming the test database as service ``pgflow_test``."""
    p = _parts(db)
    path = tmp_path / "pg_service.conf"
    path.write_text(f"[pgflow_test]\nhost={p['host']}\nport={p['port']}\nuser={p['user']}\ndbname={p['dbname']}\n")
    return path


def _ways(database, service_file) -> dict[str, tuple[list[str], dict[str, str], str]]:
    p = _parts(database)
    url = f"postgresql://{p['user']}@/{p['dbname']}?host={quote(p['host'], safe='')}&port={p['port']}"
    return {
        "key=value": (["--dsn", database.conninfo], {}, "--dsn"),
        "url": (["--dsn", url], {}, "--dsn"),
        "PG variables": ([], {"PGHOST": p["host"], "PGPORT": p["port"], "PGUSER": p["user"], "PGDATABASE": p["dbname"]},
                         "libpq defaults"),
        "service=": (["--dsn", "service=pgflow_test"], {"PGSERVICEFILE": str(service_file)}, "--dsn"),
        "PGSERVICE": ([], {"PGSERVICEFILE": str(service_file), "PGSERVICE": "pgflow_test"}, "libpq defaults"),
        "DATABASE_URL": ([], {"DATABASE_URL": url}, "DATABASE_URL"),
    }


@pytest.mark.parametrize("way", ["key=value", "url", "PG variables", "service=", "PGSERVICE", "DATABASE_URL"])
def test_json_database_and_banner_name_the_server_connected_to(db, service_file, way):
    args, env, source = _ways(db, service_file)[way]
    p = _parts(db)
    result = run_cli("migrate", "status", *args, "--format", "json", env=env)
    assert result.code == ExitCode.OK, result.output
    doc = json.loads(result.stdout)
    validate(doc, "migrate-status")
    database = doc["database"]
    assert (database["host"], str(database["port"]), database["user"], database["dbname"]) == \
        (p["host"], p["port"], p["user"], p["dbname"])
    assert database["source"].startswith(source)
    assert database["server_version_num"] >= 150000
    assert database["service"] == ("pgflow_test" if "SERVICE" in way or way == "service=" else None)

    banner = run_cli("audit", *args, env=env).stderr  # "auditing user@host:port/dbname (from ...)"
    assert f"auditing {p['user']}@{p['host']}:{p['port']}/{p['dbname']}" in banner, banner
    table = run_cli("migrate", "status", *args, "--format", "plain", env=env).stdout
    assert table.startswith(f"{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"), table


def test_a_service_that_names_another_database_is_reported_as_that_database(db, tmp_path):
    """The DSN says nothing about the database: only the connection can tell (the old banner said
    "$PGDATABASE" or the user name)."""
    p = _parts(db)
    path = tmp_path / "pg_service.conf"
    path.write_text(f"[other]\nhost={p['host']}\nport={p['port']}\nuser={p['user']}\ndbname=postgres\n")
    result = run_cli("migrate", "status", "--dsn", "service=other", "--format", "json",
                     env={"PGSERVICEFILE": str(path)})
    assert result.code == ExitCode.OK, result.output  # nothing installed there: every migration pending
    doc = json.loads(result.stdout)
    assert (doc["database"]["dbname"], doc["database"]["service"]) == ("postgres", "other")
    assert p["dbname"] not in result.output
