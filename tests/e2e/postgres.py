"""A real PostgreSQL server for tests and benchmarks: initdb into a temporary directory,
a unix socket only.

The server refuses to run as root, so under root it runs as the ``postgres`` user (else
``nobody``). ``PostgresMissing`` says why it cannot start (no server binaries, no psycopg).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path

from tests.replay.conftest import free_port

START_TIMEOUT_S = 30.0
_databases = count()


def _server_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _run_as() -> tuple[list[str], int | None]:
    """(argv prefix, uid) to drop root for the server; nothing when not root."""
    if os.geteuid() != 0:
        return [], None
    for user in ("postgres", "nobody"):
        try:
            return ["runuser", "-u", user, "--"], pwd.getpwnam(user).pw_uid
        except KeyError:
            continue
    raise PostgresMissing("running as root with neither a postgres nor a nobody user")


class PostgresMissing(Exception):
    """What is missing to start a server here."""


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server; yields its URL with ``{database}`` to fill in. Stops it after."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PostgresMissing("psycopg is not installed: pip install -e '.[postgres]'") from None
    initdb, postgres = _server_binary("initdb"), _server_binary("postgres")
    if initdb is None or postgres is None:
        raise PostgresMissing("PostgreSQL server binaries (initdb, postgres) are not installed")
    prefix, uid = _run_as()
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    if uid is not None:
        os.chown(root, uid, -1)
    data, port = root / "data", free_port()
    subprocess.run(
        [*prefix, initdb, "-D", str(data), "-A", "trust", "-U", "autotune", "--no-sync"],
        check=True,
        capture_output=True,
    )
    argv = [*prefix, postgres, "-D", str(data), "-k", str(root), "-p", str(port)]
    argv += ["-c", "listen_addresses=", "-c", "fsync=off", "-c", "max_connections=200"]
    with (root / "server.log").open("wb") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"postgresql://autotune@/{{database}}?host={root}&port={port}"
        _wait_accepting(url.format(database="postgres"), server, root / "server.log")
        yield url
    finally:
        server.send_signal(signal.SIGINT)  # fast shutdown
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(root, ignore_errors=True)


def _wait_accepting(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    """Until the server takes connections: its socket appears while it still says "the
    database system is starting up"."""
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert server.poll() is None, log.read_text()
        try:
            psycopg.connect(url).close()
            return
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, "PostgreSQL did not start"
            time.sleep(0.1)


def create_database(server_url: str) -> str:
    """A fresh, empty database on the server: its URL."""
    import psycopg

    name = f"autotune{next(_databases)}"
    with psycopg.connect(server_url.format(database="postgres"), autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return server_url.format(database=name)
