"""A fake `nvidia-cuda-mps-control`, for fake GPUs: `python -m dra.fakegpus.mpscontrol [-d [-M]]`.

It answers as the real one did on a real H200 (driver 580.159.04, MPS binary version 13000:
tests/data/real/h200-580/mps-control.txt), on the paths the driver uses:

- `-d` starts the control daemon in the background and returns 0 once it answers (`-d -M` in
  multi-user mode: the same, with -M on its command line; the real one logs nothing about it).
  It reads CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) and CUDA_MPS_LOG_DIRECTORY
  (default /var/log/nvidia-mps); in the pipe directory it makes the Unix sockets `control` and
  `control_privileged`, the file `control_lock`, the FIFO `log` and
  `nvidia-cuda-mps-control.pid` (the pid, no newline); in the log directory `control.log`, whose
  lines read `[YYYY-MM-DD HH:MM:SS.mmm Control   PID] ...`, and an empty `server.log`. A
  second `-d` on the same pipe directory prints "An instance of this daemon is already running"
  and exits 1. The devices it manages are its CUDA_VISIBLE_DEVICES (its environment; not logged).
- Without arguments it is a client: it sends each line of stdin to the daemon of
  CUDA_MPS_PIPE_DIRECTORY and prints the answer; with no daemon there it prints "Cannot find MPS
  control daemon process" and exits 1.
  - `set_default_active_thread_percentage N` answers the default percentage after the command,
    as "%.1f": N when 0 < N <= 100, else the percentage it kept (no error);
    `get_default_active_thread_percentage` answers it ("100.0" at first).
  - `set_default_device_pinned_mem_limit <dev> <value>` answers nothing, whatever the device or
    value: digits then a unit, G for GiB and anything else taken as MiB (the real daemon made
    "2X" 2 MiB); `get_default_device_pinned_mem_limit <dev>` answers the limit in whole GiB from
    1 GiB on ("1024M" and "1536M" both read "1G"), else in MiB (no smaller limit was read back
    in the recording), and nothing for a device without one.
  - Anything else: `Unknown command "<line>"`. `get_server_list`: nothing (the fake starts no
    server). `quit`: nothing; the daemon exits, removing its pid file and `log` FIFO and leaving
    the sockets and the lock file behind.

Where it differs: it makes no MPS server and so no shared memory (the real server, started at a
client's first connection, made "an anonymous shared memory region": nothing in /dev/shm either);
and it takes CUDA_VISIBLE_DEVICES as given, where the real one exits 100, printing and logging
nothing, when a device there is not on the machine (the fake knows no machine's devices).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL = "control"
#: What the real daemon left in its pipe directory after `quit`.
LEFT_AFTER_QUIT = (CONTROL, "control_lock", "control_privileged")
_LIMIT = re.compile(r"^([0-9]+)(.?)")
_MIB = 1024**2


def pipe_directory() -> Path:
    """The daemon's pipe directory from the environment, as the real one reads it."""
    return Path(os.environ.get(PIPE_DIRECTORY) or "/tmp/nvidia-mps")


def _log_directory() -> Path:
    return Path(os.environ.get(LOG_DIRECTORY) or "/var/log/nvidia-mps")


def _log(message: str) -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    with (_log_directory() / "control.log").open("a") as log:
        log.write(f"[{stamp} Control {os.getpid():5d}] {message}\n")


def _limit_bytes(value: str) -> int | None:
    """A pinned memory limit as the real daemon reads it: digits, then G for GiB, else MiB."""
    found = _LIMIT.match(value)
    if found is None:
        return None
    return int(found.group(1)) * (1024 * _MIB if found.group(2) == "G" else _MIB)


def _limit_text(size: int) -> str:
    """A limit in bytes as the real daemon answers it: whole GiB from 1 GiB on ("1536M" set reads "1G",
    recorded), else whole MiB (assumed: the recording has no smaller limit read back)."""
    return f"{size // (1024 * _MIB)}G" if size >= 1024 * _MIB else f"{size // _MIB}M"


class _Daemon:
    def __init__(self) -> None:
        self.percentage = 100.0
        self.limits: dict[int, int] = {}

    def handle(self, line: str) -> tuple[str, bool]:
        """The answer to one command, and whether the daemon goes on."""
        words = line.split()
        if not words:
            return "", True
        _log(f"Cmd:{line.strip()}")
        command, args = words[0], words[1:]
        if command == "quit" and not args:
            _log("Exit with status 0")
            # Gone before the client hears back, so that it finds the daemon gone once answered.
            for name in ("log", PID_FILE):
                with contextlib.suppress(FileNotFoundError):
                    (pipe_directory() / name).unlink()
            return "", False
        if command == "get_server_list" and not args:
            return "", True
        if command == "get_default_active_thread_percentage" and not args:
            return f"{self.percentage:.1f}", True
        if command == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if 0 < value <= 100:
                self.percentage = value
            return f"{self.percentage:.1f}", True
        if command == "set_default_device_pinned_mem_limit" and len(args) == 2 and args[0].isdigit():
            size = _limit_bytes(args[1])
            if size is not None:
                self.limits[int(args[0])] = size
            _log(f"{line.strip()}.")
            return "", True
        if command == "get_default_device_pinned_mem_limit" and len(args) == 1 and args[0].isdigit():
            size = self.limits.get(int(args[0]))
            return ("" if size is None else _limit_text(size)), True
        answer = f'Unknown command "{line.strip()}"'
        _log(answer)
        return answer, True


def _serve(pipe: Path) -> None:
    daemon = _Daemon()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Absolute paths, as the real daemon binds them: a pipe directory too long for them fails alike.
    server.bind(str(pipe / CONTROL))
    server.listen(8)
    privileged = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    privileged.bind(str(pipe / "control_privileged"))
    (pipe / "control_lock").touch()
    os.mkfifo(pipe / "log")
    (pipe / PID_FILE).write_text(str(os.getpid()))
    (_log_directory() / "server.log").touch()
    _log(f"Starting control daemon using socket {pipe / CONTROL}")
    _log(f"To connect CUDA applications to this daemon, set env {PIPE_DIRECTORY}={pipe}")
    _log("CUDA MPS Control binary version: 13000")
    running = True
    while running:
        connection, _ = server.accept()
        with connection, connection.makefile("rw") as stream:
            line = stream.readline()
            if not line.strip():
                continue  # a liveness probe
            _log("NEW UI")
            answer, running = daemon.handle(line)
            stream.write(answer + "\n")
            if running:
                _log("UI closed")


def _send(pipe: Path, line: str) -> str | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(pipe / CONTROL))
            with client.makefile("rw") as stream:
                stream.write(line + "\n")
                stream.flush()
                return stream.readline().rstrip("\n")
    except OSError:
        return None


def _start_daemon() -> int:
    pipe = pipe_directory()
    pipe.mkdir(parents=True, exist_ok=True)
    _log_directory().mkdir(parents=True, exist_ok=True)
    if _send(pipe, "") is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    for name in (*LEFT_AFTER_QUIT, "log"):
        with contextlib.suppress(FileNotFoundError):
            (pipe / name).unlink()
    if os.fork() > 0:
        # The caller returns once the daemon answers, as the real -d does once it is up.
        for _ in range(100):
            if _send(pipe, "") is not None:
                return 0
            time.sleep(0.05)
        print("the MPS control daemon did not start", file=sys.stderr)
        return 1
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        _serve(pipe)
    finally:
        os._exit(0)


def _client() -> int:
    pipe = pipe_directory()
    for line in sys.stdin:
        answer = _send(pipe, line.strip())
        if answer is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        if answer:
            print(answer)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`-d`: start the daemon; no argument: send stdin's commands to it."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-d"], ["-d", "-M"]):
        return _start_daemon()
    if not args:
        return _client()
    print(f"Usage: nvidia-cuda-mps-control [-d [-M]]; unknown option {' '.join(args)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
