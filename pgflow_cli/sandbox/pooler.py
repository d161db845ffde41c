"""A private PgBouncer in front of a :class:`~pgflow_cli.sandbox.embedded.LocalServer` (tests, benchmarks).

It runs Debian's ``pgbouncer`` binary (``/usr/sbin/pgbouncer``, or the one on ``PATH``,
``PGFLOW_PGBOUNCER`` overrides) in the foreground, as the ``postgres`` system user when started by
root (the same account the server runs as), with every file in one base directory:

* every database of the server is reachable under its own name (the ``*`` fallback entry); the
  pooler reaches the server over the server's Unix socket;
* clients log in with the server's own password (SCRAM), which the pooler checks against the
  server's ``pg_authid`` (``auth_user``): what a production PgBouncer with ``auth_query`` does;
* it listens on 127.0.0.1 and on a Unix socket of its own, both on one free port;
* ``pool_mode`` is ``transaction`` unless asked otherwise. ``strict`` adds
  ``server_reset_query_always``: every server connection is reset with ``DISCARD ALL`` after each
  transaction, so code that relies on session state (prepared statements, session ``SET``,
  advisory locks, temporary tables) fails every time instead of only when the pooler happens to
  hand the client another connection (PgBouncer's own description of the setting).

The process gets ``SIGTERM`` when the Python thread that started it ends (``PR_SET_PDEATHSIG``), so
a crashed test worker or benchmark does not leave it behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pgflow_cli.errors import ConnectionFailed, UsageError
from pgflow_cli.sandbox.embedded import LocalServer, ServerError, _service_account, free_port

PGBOUNCER_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
POOL_MODES = ("session", "transaction", "statement")
_PR_SET_PDEATHSIG = 1


def find_pgbouncer() -> str | None:
    """Path of the ``pgbouncer`` binary: ``$PGFLOW_PGBOUNCER``, ``PATH``, then Debian's places; ``None``: absent."""
    override = os.environ.get("PGFLOW_PGBOUNCER")
    if override:
        return override if os.access(override, os.X_OK) else None
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((path for path in PGBOUNCER_CANDIDATES if os.access(path, os.X_OK)), None)


def _die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` asking Linux to send the child SIGTERM when the starting thread ends. libc is
    looked up here, in the parent: the child only calls the function (nothing that takes a lock)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return preexec


class LocalPooler:
    """One PgBouncer process in front of ``server``.

    Args:
        base_dir: where its configuration, log and socket go (created; deleted by :meth:`destroy`).
        server: the running :class:`LocalServer` it pools (its Unix socket, its superuser).
        pool_mode: ``transaction`` (default), ``session`` or ``statement``.
        pool_size: server connections per database and user (``default_pool_size``).
        strict: reset every server connection after each transaction (see the module docstring).
        max_client_conn: client connections it accepts.

    Attributes:
        port: the TCP port on 127.0.0.1, also the number of its socket file.
        socket_dir: directory of its Unix socket.
        log_file: its log.
    """

    def __init__(self, base_dir: Path, server: LocalServer, *, pool_mode: str = "transaction", pool_size: int = 20,
                 strict: bool = False, max_client_conn: int = 1000) -> None:
        if pool_mode not in POOL_MODES:
            raise UsageError(f"unknown pool mode {pool_mode!r}; one of {', '.join(POOL_MODES)}")
        self.base_dir = Path(base_dir)
        self.server = server
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.strict = strict
        self.max_client_conn = max_client_conn
        self.port = 0
        self.socket_dir = self.base_dir / "run"
        self.log_file = self.base_dir / "pgbouncer.log"
        self.config_file = self.base_dir / "pgbouncer.ini"
        self.auth_file = self.base_dir / "userlist.txt"
        self._proc: subprocess.Popen[bytes] | None = None

    # connection strings ------------------------------------------------------------------------
    def conninfo(self, dbname: str = "postgres", *, tcp: bool = True) -> str:
        """libpq conninfo of ``dbname`` through the pooler, with the server's password (a test secret).

        Args:
            tcp: 127.0.0.1 and the port (default), else the pooler's Unix socket.
        """
        from psycopg.conninfo import make_conninfo

        host = "127.0.0.1" if tcp else str(self.socket_dir)
        return make_conninfo(host=host, port=str(self.port), user=self.server.config.superuser, dbname=dbname,
                             password=self.server.config.password)

    # lifecycle ----------------------------------------------------------------------------------
    def start(self, *, timeout: float = 30.0) -> None:
        """Write the configuration, start the process, wait until it lets a client in.

        Raises:
            ServerError: no ``pgbouncer`` binary, or it exited or did not answer within ``timeout`` s
                (its log's last lines in the detail).
        """
        binary = find_pgbouncer()
        if binary is None:
            raise ServerError("no pgbouncer binary found",
                              hint="install it (Debian/Ubuntu: apt-get install pgbouncer) or set PGFLOW_PGBOUNCER")
        account = _service_account()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        self.port = free_port()
        self.config_file.write_text(self._configuration())
        self.auth_file.write_text(self._auth_file())
        for path in (self.config_file, self.auth_file):
            os.chmod(path, 0o600)
        self.log_file.touch()
        if account:
            for path in (self.base_dir, self.socket_dir, self.config_file, self.auth_file, self.log_file):
                os.chown(path, account.pw_uid, account.pw_gid)
        self._proc = subprocess.Popen(
            [binary, str(self.config_file)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd=str(self.base_dir), preexec_fn=_die_with_parent(),
            user=account.pw_uid if account else None, group=account.pw_gid if account else None,
            extra_groups=[] if account else None,
        )
        self._wait_ready(timeout)

    def _configuration(self) -> str:
        server = self.server
        auth_user = server.config.superuser
        lines = [
            "[databases]",
            f"* = host={server.socket_dir} port={server.port}",
            "",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            f"unix_socket_dir = {self.socket_dir}",
            f"logfile = {self.log_file}",
            f"pool_mode = {self.pool_mode}",
            f"default_pool_size = {self.pool_size}",
            f"max_client_conn = {self.max_client_conn}",
            "auth_type = scram-sha-256",
            f"auth_file = {self.auth_file}",
            # other roles' secrets are read from the server when they log in
            f"auth_user = {auth_user}",
            "auth_query = SELECT rolname, rolpassword FROM pg_catalog.pg_authid WHERE rolname = $1 AND rolcanlogin",
            # test databases come and go: a failed login (a dropped database) is not retried for long
            "server_login_retry = 1",
            "log_connections = 0",
            "log_disconnections = 0",
            "admin_users = ",
        ]
        if self.strict:
            lines += ["server_reset_query = DISCARD ALL", "server_reset_query_always = 1"]
        return "\n".join(lines) + "\n"

    def _auth_file(self) -> str:
        """The superuser's SCRAM secret as the server stores it (the pooler's own login as ``auth_user``)."""
        from pgflow_cli import db

        with db.connect(db.Target(self.server.conninfo("postgres"), "local server")) as conn:
            row = conn.execute("SELECT rolname, rolpassword FROM pg_catalog.pg_authid WHERE rolname = current_user"
                               ).fetchone()
        if row is None or not row[1]:
            raise ServerError("the server's superuser has no password for the pooler to check logins against")
        return f'"{row[0]}" "{row[1]}"\n'

    def _wait_ready(self, timeout: float) -> None:
        from pgflow_cli import db

        deadline = time.monotonic() + timeout
        last = ""
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ServerError(f"pgbouncer exited at start (status {self._proc.returncode})",
                                  hint=f"read {self.log_file}", detail=self._log_tail())
            try:
                db.connect(db.Target(self.conninfo("postgres"), "local pooler"), connect_timeout=5).close()
                return
            except ConnectionFailed as exc:
                last = exc.message
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"pgbouncer did not let a client in within {timeout:.0f} s: {last}",
                                  hint=f"read {self.log_file}", detail=self._log_tail())
            time.sleep(0.1)

    def _log_tail(self) -> list[str]:
        with contextlib.suppress(OSError):
            return self.log_file.read_text(errors="replace").strip().splitlines()[-5:]
        return []

    @property
    def pid(self) -> int | None:
        """The process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def stop(self) -> None:
        """Shut it down at once (``SIGTERM``: clients are disconnected) and wait for the process."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def destroy(self) -> None:
        """Stop it and delete its base directory."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)
