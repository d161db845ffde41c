"""A private local PostgreSQL server: used by ``pgflow sandbox`` and by the test harness.

The server:

* uses the PostgreSQL server binaries found on ``PATH``, through ``pg_config --bindir``,
  or under ``/usr/lib/postgresql/<major>/bin`` (newest first); ``PGFLOW_PG_BINDIR``
  overrides the search;
* keeps its data directory, log and Unix socket in one base directory;
* listens on its Unix socket only (``listen_addresses=''``) unless loopback TCP is asked
  for, on a free port; local socket connections use ``trust`` inside a socket directory
  only its owner may enter (mode 0700), TCP connections require a SCRAM password;
* when started by root, runs as the ``postgres`` system user, because PostgreSQL refuses
  to run as root; the base directory is then owned by that user.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pgflow_cli.errors import ConnectionFailed, PgflowError, UsageError

SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
SERVICE_USER = "postgres"
"""System user the server runs as when the caller is root."""

FAST_SETTINGS = {
    # A throwaway server: durability is not needed, speed is.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "128MB",
}


class ServerError(PgflowError):
    """The local server could not be found, initialised or started (exit 3)."""

    exit_code = ConnectionFailed.exit_code


def find_bindir() -> Path:
    """Locate a directory with ``initdb``, ``pg_ctl`` and ``postgres``.

    Order: ``$PGFLOW_PG_BINDIR``; ``PATH``; ``pg_config --bindir``;
    ``/usr/lib/postgresql/<N>/bin`` with the highest N.

    Raises:
        ServerError: none found, with the install command as hint.
    """
    override = os.environ.get("PGFLOW_PG_BINDIR")
    candidates: list[Path] = []
    if override:
        candidates.append(Path(override))
    on_path = [shutil.which(name) for name in SERVER_BINARIES]
    if on_path[0] and all(on_path):
        candidates.append(Path(os.path.realpath(on_path[0])).parent)
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            candidates.append(Path(out.stdout.strip()))
        except (subprocess.SubprocessError, OSError):
            pass
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted(
            (p for p in debian.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True
        )
        candidates.extend(v / "bin" for v in versions)
    for candidate in candidates:
        if all((candidate / name).is_file() for name in SERVER_BINARIES):
            return candidate
    raise ServerError(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found",
        hint="install the server (Debian/Ubuntu: apt-get install postgresql) or set PGFLOW_PG_BINDIR to its bin directory",
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _service_account() -> pwd.struct_passwd | None:
    """The account to run the server as: ``postgres`` when we are root, else ``None`` (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        raise ServerError(
            "running as root, and there is no 'postgres' system user to run the server as",
            hint="create it (useradd --system postgres) or run pgflow as an ordinary user",
        ) from None


@dataclass
class ServerConfig:
    """Persistent description of a local server (saved as ``server.json`` in the base dir).

    Attributes:
        base_dir: directory holding ``data/``, ``run/`` (socket) and ``server.log``.
        port: port number (also names the Unix socket file).
        tcp: also listen on 127.0.0.1 (password required there).
        superuser: name of the bootstrap superuser.
        password: password for TCP logins (kept in the 0600 server.json, never printed).
        bindir: PostgreSQL binaries used to create the cluster.
    """

    base_dir: str
    port: int
    tcp: bool = False
    superuser: str = "postgres"
    password: str = ""
    bindir: str = ""
    settings: dict[str, str] = field(default_factory=dict)


class LocalServer:
    """Lifecycle of one private PostgreSQL cluster.

    Args:
        base_dir: where everything lives (created if needed).
        port: port to use; ``None`` picks a free one at :meth:`init`.
        tcp: listen on 127.0.0.1 too.
        settings: extra ``postgresql.conf`` settings.

    Attributes:
        data_dir, socket_dir, log_file, config_file: ``base_dir`` / ``data``, ``run`` (the Unix
            socket), ``server.log`` and ``server.json``.
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        port: int | None = None,
        tcp: bool = False,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.socket_dir = self.base_dir / "run"
        self.log_file = self.base_dir / "server.log"
        self.config_file = self.base_dir / "server.json"
        saved = self._load_config()
        if saved:
            self.config = saved
        else:
            self.config = ServerConfig(
                base_dir=str(self.base_dir),
                port=port or 0,
                tcp=tcp,
                password=os.urandom(18).hex(),
                settings=dict(settings or {}),
            )

    @property
    def port(self) -> int:
        return self.config.port

    def _load_config(self) -> ServerConfig | None:
        path = self.config_file
        if not path.is_file():
            return None
        try:
            return ServerConfig(**json.loads(path.read_text()))
        except (ValueError, TypeError) as exc:
            raise ServerError(f"{path} is damaged: {exc}", hint="remove the directory and create the server again") from None

    def _save_config(self) -> None:
        self.config_file.write_text(json.dumps(asdict(self.config), indent=2))
        os.chmod(self.config_file, 0o600)

    # state -----------------------------------------------------------------
    def exists(self) -> bool:
        """True when the cluster has been initialised."""
        return (self.data_dir / "PG_VERSION").is_file()

    def is_running(self) -> bool:
        """True when ``pg_ctl status`` reports a running server."""
        if not self.exists():
            return False
        result = self._run([self._bin("pg_ctl"), "status", "-D", str(self.data_dir)], check=False)
        return result.returncode == 0

    def conninfo(self, dbname: str = "postgres", *, tcp: bool = False) -> str:
        """libpq conninfo for a database on this server (socket by default; no password included).

        Values are quoted as libpq reads them (:func:`keyword_conninfo`), so a directory with spaces
        or quotes works; psycopg is not imported (``pgflow sandbox dsn`` stays cheap).
        """
        host = "127.0.0.1" if tcp else str(self.socket_dir)
        return keyword_conninfo(host=host, port=str(self.port), user=self.config.superuser, dbname=dbname)

    # actions ---------------------------------------------------------------
    def init(self) -> None:
        """Create the base directory and the cluster (idempotent).

        ``initdb`` writes into ``data.initdb`` and the directory becomes ``data`` only when it
        succeeded, so a run that failed or was killed half way is cleared and redone next time.
        """
        if self.exists():
            return
        account = _service_account()
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            self.socket_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"cannot create the server directory {self.base_dir}: {exc.strerror}",
                hint="choose a directory you can write to (PGFLOW_SANDBOX_DIR for the sandbox)",
            ) from None
        if not self.config.port:
            self.config.port = free_port()
        self.config.bindir = str(find_bindir())
        self._save_config()
        if account:
            for path in (self.base_dir, self.socket_dir, self.config_file):
                os.chown(path, account.pw_uid, account.pw_gid)
        os.chmod(self.base_dir, 0o700)
        os.chmod(self.socket_dir, 0o700)
        building = self.base_dir / "data.initdb"
        shutil.rmtree(building, ignore_errors=True)  # the leftover of an interrupted init
        pwfile = self.base_dir / ".initdb-pw"
        pwfile.write_text(self.config.password + "\n")
        os.chmod(pwfile, 0o600)
        if account:
            os.chown(pwfile, account.pw_uid, account.pw_gid)
        try:
            self._run(
                [
                    self._bin("initdb"),
                    "-D", str(building),
                    "-U", self.config.superuser,
                    "--pwfile", str(pwfile),
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E", "UTF8",
                    "--locale=C.UTF-8",
                    "--no-sync",
                ]
            )
        finally:
            pwfile.unlink(missing_ok=True)
        building.rename(self.data_dir)

    def start(self, *, timeout: float = 60.0) -> None:
        """Start the server (no-op when running) and wait until it accepts connections."""
        if not self.exists():
            self.init()
        if self.is_running():
            return
        settings = dict(FAST_SETTINGS)
        settings.update(self.config.settings)
        settings["listen_addresses"] = "'127.0.0.1'" if self.config.tcp else "''"
        settings["unix_socket_directories"] = f"'{self.socket_dir}'"
        settings["port"] = str(self.port)
        options = " ".join(f"-c {key}={value}" for key, value in settings.items())
        self._run(
            [
                self._bin("pg_ctl"), "start",
                "-D", str(self.data_dir),
                "-l", str(self.log_file),
                "-o", options,
                "-w", "-t", str(int(timeout)),
            ]
        )

    def stop(self, *, mode: str = "fast") -> None:
        """Stop the server if it runs (``mode``: smart, fast or immediate)."""
        if self.is_running():
            self._run([self._bin("pg_ctl"), "stop", "-D", str(self.data_dir), "-m", mode, "-w"])

    def destroy(self) -> None:
        """Stop the server and delete the whole base directory."""
        self.stop(mode="immediate")
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Poll until a connection succeeds (``pg_ctl -w`` already waits; this double-checks)."""
        from pgflow_cli import db

        deadline = time.monotonic() + timeout
        while True:
            try:
                db.connect(db.Target(self.conninfo(), "local server"), connect_timeout=5).close()
                return
            except ConnectionFailed:
                if time.monotonic() > deadline:
                    raise ServerError(f"the local server did not accept connections within {timeout:.0f}s",
                                      hint=f"read {self.log_file}") from None
                time.sleep(0.2)

    # helpers ---------------------------------------------------------------
    def _bin(self, name: str) -> str:
        bindir = Path(self.config.bindir) if self.config.bindir else find_bindir()
        return str(bindir / name)

    def _run(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        account = _service_account()
        env = dict(os.environ)
        env.pop("PGDATA", None)
        try:
            result = subprocess.run(
                argv, capture_output=True, text=True, env=env, cwd=str(self.base_dir), timeout=300,
                user=account.pw_uid if account else None, group=account.pw_gid if account else None,
                extra_groups=[] if account else None,
            )
        except FileNotFoundError as exc:
            raise ServerError(f"cannot run {argv[0]}: {exc.strerror}", hint="check the PostgreSQL installation") from None
        except PermissionError as exc:
            raise ServerError(f"cannot run {argv[0]}: {exc.strerror}",
                              hint=f"the server user must be able to enter {self.base_dir}") from None
        if check and result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
            log_tail: list[str] = []
            if self.log_file.is_file():
                log_tail = self.log_file.read_text(errors="replace").strip().splitlines()[-5:]
            raise ServerError(
                f"{Path(argv[0]).name} {argv[1] if len(argv) > 1 else ''} failed (exit {result.returncode})",
                hint=f"see {self.log_file}" if log_tail else "",
                detail=tail + log_tail,
            )
        return result


_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./:@+-]+")


def keyword_conninfo(**params: str) -> str:
    """A libpq keyword/value connection string: each value as is when it is plain, else in single
    quotes with backslashes and quotes escaped (libpq's rule for conninfo strings).

    Args:
        **params: libpq keywords and their values, in the order written.
    """
    def quoted(value: str) -> str:
        if _PLAIN_VALUE.fullmatch(value):
            return value
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return " ".join(f"{key}={quoted(value)}" for key, value in params.items())


def validate_base_dir(path: Path) -> Path:
    """Reject base directories the server user could not use (too long a socket path)."""
    socket_path = Path(path) / "run" / ".s.PGSQL.65535"
    if len(str(socket_path)) > 100:
        raise UsageError(
            f"the directory {path} is too deep for a Unix socket path ({len(str(socket_path))} > 100 bytes)",
            hint="choose a shorter path with PGFLOW_SANDBOX_DIR",
        )
    return Path(path)
