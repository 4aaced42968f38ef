"""A server subprocess in its own session, and the guarantee that none outlives autotune.

Each server starts with ``setsid`` (its pid is its process group and session id),
stdout and stderr in one log file. Three layers keep it from outliving us:

1. ``ServerProcess.stop``: SIGINT (as Ctrl-C would), then SIGTERM, then SIGKILL
   to the whole group, until a /proc scan finds no live member of the session.
2. ``kill_all_servers()``: for the CLI's SIGTERM / Ctrl-C handler.
3. For ``kill -9`` of autotune: ``PR_SET_PDEATHSIG`` (SIGTERM) on the server
   itself, and a watchdog process (``_watchdog.py``) holding a pipe from us; when
   the pipe closes it kills the session, grandchildren (vLLM's EngineCore and
   workers) included, which PDEATHSIG alone does not reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from autotune.engines._watchdog import session_members
from autotune.engines.vllm_log import AUTOTUNE_LINE_PREFIX
from autotune.errors import EngineError
from autotune.redaction import redact, redact_file

INTERRUPT_GRACE_S = 5.0  # vLLM exits within ~2 s of SIGINT, its group within ~3 s
TERMINATE_GRACE_S = 3.0
KILL_GRACE_S = 2.0
WATCHDOG_GRACE_S = 3.0
POLL_S = 0.05
_PR_SET_PDEATHSIG = 1
_WATCHDOG_SCRIPT = Path(__file__).with_name("_watchdog.py")
HELD_AT_FORK = (signal.SIGINT, signal.SIGTERM)  # what the CLI turns into KeyboardInterrupt

# Servers started by this process and not yet stopped; read by kill_all_servers(),
# which a signal handler calls, so it cannot be handed around as an argument.
_LIVE: dict[int, ServerProcess] = {}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the server may still lose a race for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def interrupt_after_forks() -> Iterator[None]:
    """Hold a Ctrl-C or SIGTERM that arrives while we fork until the block is done.

    Python runs fork hooks (logging's lock release) in the parent after each fork it
    makes itself (a process pool's, a ``Popen`` with ``preexec_fn``), and a
    KeyboardInterrupt raised inside one is printed and ignored: the run then went on as
    if Ctrl-C had never been pressed. The CLI turns SIGTERM into the same
    KeyboardInterrupt, and a worker of ``run --gpus`` whose SIGTERM (its parent's
    death) was swallowed so went on tuning alone, its servers with it. Here each signal
    whose handler is Python's only sets a flag meanwhile.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in HELD_AT_FORK}
    held = {sig: handler for sig, handler in previous.items() if callable(handler)}
    arrived: list[int] = []
    for sig in held:
        signal.signal(sig, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
    if arrived:
        held[arrived[0]](arrived[0], None)  # the handler it would have run: KeyboardInterrupt


def child_preexec() -> Callable[[], None] | None:
    """A preexec_fn for a server: SIGINT and SIGTERM back to their defaults, SIGTERM to it
    when we die.

    A shell starts a background job (``autotune run ... &``) with SIGINT ignored and
    every child inherits that, so the server would sit out ``stop``'s graceful SIGINT.
    SIGTERM goes back to its default before the parent-death signal is armed: if we
    die after the check below and before the exec, the signal comes while the child
    still has our disposition, and a Python handler (the CLI's) only sets a flag that
    the exec forgets, an ignored one drops it: the server then ran on, watched by no one.
    None where there is no prctl (not Linux).
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl, set_disposition = libc.prctl, libc.signal  # resolved before fork
    parent_pid = os.getpid()

    def preexec() -> None:
        set_disposition(signal.SIGINT, signal.SIG_DFL)  # libc: safe off the main thread
        set_disposition(signal.SIGTERM, signal.SIG_DFL)
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # we died between fork and prctl
            os._exit(1)

    return preexec


class ServerProcess:
    """One launched server: its process, session, log file and watchdog."""

    def __init__(self, popen: subprocess.Popen[bytes], watchdog: _Watchdog, log_path: Path):
        self._popen = popen
        self._watchdog = watchdog
        self.log_path = log_path
        self._log_offset = 0
        self._log_chunks: list[str] = []

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        preamble: Sequence[str] = (),
    ) -> ServerProcess:
        """Start ``argv`` in a new session; output goes to ``log_path`` (truncated).

        ``preamble`` lines are written first, each prefixed ``# autotune: `` (the
        failure classifier skips them), secrets redacted; the server's own lines are
        redacted once it is stopped and none of its processes can write any more.
        Raises ``EngineError`` when the executable cannot be started at all.
        """
        # Python's fork hooks run for a preexec_fn; a Ctrl-C meanwhile is raised once the
        # server is registered, so the interrupt handler stops it.
        with interrupt_after_forks():
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with log_path.open("wb") as log_file:
                header = "".join(f"{AUTOTUNE_LINE_PREFIX}{redact(line)}\n" for line in preamble)
                log_file.write(header.encode())
                log_file.flush()
                try:
                    popen = subprocess.Popen(
                        list(argv),
                        stdin=subprocess.DEVNULL,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        env=dict(env),
                        start_new_session=True,
                        # Two libc calls after fork: safe even with other threads running.
                        preexec_fn=child_preexec(),
                    )
                except OSError as exc:
                    raise EngineError(f"cannot start {argv[0]}: {exc}") from exc
            server = cls(popen, _Watchdog.start(popen.pid), log_path)
            _LIVE[popen.pid] = server
        return server

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def argv(self) -> list[str]:
        return [str(arg) for arg in self._popen.args]  # type: ignore[union-attr]  # always a list here

    def exit_code(self) -> int | None:
        """The main process's exit code (negative: killed by that signal), None if running."""
        return self._popen.poll()

    def read_new_log(self) -> str:
        """Log text written since the last call (whole lines or not)."""
        with self.log_path.open("rb") as log_file:
            log_file.seek(self._log_offset)
            data = log_file.read()
        self._log_offset += len(data)
        text = data.decode("utf-8", errors="replace")
        self._log_chunks.append(text)
        return text

    def log_text(self) -> str:
        """Everything logged so far."""
        self.read_new_log()
        return "".join(self._log_chunks)

    def members(self) -> list[int]:
        """Live processes of the server's session (main process, EngineCore, workers)."""
        members = session_members(self.pid)
        if members or sys.platform.startswith("linux"):
            return members
        try:  # no /proc: the group id still answers signal 0 while anyone is in it
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return []
        return [self.pid]

    def alive(self) -> bool:
        return self.exit_code() is None or bool(self.members())

    def _signal(self, sig: signal.Signals) -> None:
        """``sig`` to every member; SIGCONT after it, so that a stopped (SIGSTOP) server
        acts on a SIGINT or SIGTERM now rather than waiting for SIGKILL."""
        targets = sorted({self.pid, *self.members()})
        for follow in (sig, signal.SIGCONT) if sig != signal.SIGKILL else (sig,):
            for pid in targets:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if pid == self.pid:
                        os.killpg(pid, follow)
                    else:
                        os.kill(pid, follow)

    async def wait_exit(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for the main process to exit; its exit code or None."""
        deadline = time.monotonic() + timeout_s
        while self.exit_code() is None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        return self.exit_code()

    async def stop(
        self,
        *,
        interrupt_grace_s: float = INTERRUPT_GRACE_S,
        terminate_grace_s: float = TERMINATE_GRACE_S,
    ) -> int | None:
        """SIGINT, SIGTERM, SIGKILL to the whole session until no member is left.

        Returns the main process's exit code. Raises ``EngineError`` if a member
        survives SIGKILL (a process stuck in the kernel).
        """
        steps = (
            (signal.SIGINT, interrupt_grace_s),
            (signal.SIGTERM, terminate_grace_s),
            (signal.SIGKILL, KILL_GRACE_S),
        )
        for sig, grace_s in steps:
            if not self.alive():
                break
            self._signal(sig)
            deadline = time.monotonic() + grace_s
            while self.alive() and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)
        return self._finish()

    def kill_now(self, grace_s: float = TERMINATE_GRACE_S) -> int | None:
        """Synchronous SIGTERM then SIGKILL of the session (for signal handlers)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.alive():
                break
            self._signal(sig)
            deadline = time.monotonic() + grace_s
            while self.alive() and time.monotonic() < deadline:
                time.sleep(POLL_S)
        return self._finish()

    def _finish(self) -> int | None:
        _LIVE.pop(self.pid, None)
        self._watchdog.release()
        survivors = self.members()
        if survivors:
            raise EngineError(f"server session {self.pid} survived SIGKILL: pids {survivors}")
        redact_file(self.log_path)  # the artifact and the runs dir keep no key it echoed
        return self.exit_code()


class _Watchdog:
    """The guard process for one server session; ``release`` stands it down."""

    def __init__(self, popen: subprocess.Popen[bytes] | None, pipe_fd: int | None):
        self._popen = popen
        self._pipe_fd = pipe_fd

    @classmethod
    def start(cls, session_id: int) -> _Watchdog:
        if not sys.platform.startswith("linux"):
            return cls(None, None)  # the /proc scan it relies on is Linux-only
        read_fd, write_fd = os.pipe()  # both non-inheritable: no other child holds them
        try:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    *("-I", "-S", str(_WATCHDOG_SCRIPT)),
                    *(str(session_id), str(WATCHDOG_GRACE_S)),
                ],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read_fd)
        return cls(popen, write_fd)

    def release(self) -> None:
        """Tell the watchdog the server is gone, so it exits without killing anything."""
        if self._pipe_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._pipe_fd, b"q")
        os.close(self._pipe_fd)
        self._pipe_fd = None
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=1.0)


def kill_all_servers() -> int:
    """Kill every server this process started and has not stopped; how many there were.

    Synchronous and safe to call from a signal handler or ``finally`` at exit.
    """
    servers = list(_LIVE.values())
    for server in servers:
        with contextlib.suppress(EngineError):
            server.kill_now()
    return len(servers)
