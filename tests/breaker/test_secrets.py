"""Passwords must never reach stdout or stderr, whatever shape the connection string has.

Real operators paste generated passwords into DATABASE_URL without percent-encoding them; `/` and
`@` are common in generated passwords (base64, password managers). libpq then parses part of the
password as host, port or database name, and every message that describes the target prints it.
"""

from __future__ import annotations

import json

import pytest

from pgflow_cli.errors import ExitCode
from tests.support.cli import run_cli


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_url_password_with_unescaped_slash_is_never_printed(harness, fmt):
    secret_tail = "Slash-Leak-4471"
    dsn = f"postgresql://postgres:Top/{secret_tail}@127.0.0.1:{harness.server.port}/postgres"
    result = run_cli("audit", "--dsn", dsn, "--format", fmt, "--connect-timeout", "3")
    assert result.code in (ExitCode.USAGE, ExitCode.CONNECTION), result.output
    assert "Traceback" not in result.output
    assert secret_tail not in result.output


def test_url_password_with_unescaped_at_sign_is_never_printed(harness):
    secret_tail = "AtSign-Leak-9020"
    dsn = f"postgresql://postgres:Hx9@{secret_tail}@127.0.0.1:{harness.server.port}/postgres"
    result = run_cli("audit", "--dsn", dsn, "--connect-timeout", "3")
    assert result.code in (ExitCode.USAGE, ExitCode.CONNECTION), result.output
    assert secret_tail not in result.output


def test_malformed_key_value_dsn_never_echoes_the_secret():
    secret = "Pa55-Leaky-31"
    result = run_cli("audit", "--dsn", f'host=127.0.0.1 password:"{secret}"', "--format", "json")
    assert result.code == ExitCode.USAGE, result.output
    assert json.loads(result.stderr)["exit_code"] == ExitCode.USAGE
    assert secret not in result.output


def test_pgpassword_and_service_file_passwords_are_not_printed(harness, tmp_path):
    """Wrong passwords from PGPASSWORD and from a service file: exit 3, never printed (guards env paths)."""
    service = tmp_path / "pg_service.conf"
    service.write_text(f"[brk]\nhost=127.0.0.1\nport={harness.server.port}\nuser=postgres\n"
                       "dbname=postgres\npassword=Svc-Wrong-5512\n")
    by_env = run_cli("audit", "--dsn", f"host=127.0.0.1 port={harness.server.port} user=postgres dbname=postgres",
                     env={"PGPASSWORD": "Env-Wrong-6613"})
    by_service = run_cli("migrate", "status", "--format", "json",
                         env={"PGSERVICEFILE": str(service), "PGSERVICE": "brk"})
    for result, secret in ((by_env, "Env-Wrong-6613"), (by_service, "Svc-Wrong-5512")):
        assert result.code == ExitCode.CONNECTION, result.output
        assert "authentication failed" in result.stderr
        assert secret not in result.output
        assert harness.server.config.password not in result.output
