"""A fake `nvidia-cuda-mps-control`, for fake GPUs: `python -m dra.gpu.fakemps [-d [-M]]`.

It behaves as NVIDIA's MPS documentation ("Multi-Process Service", section
"Tools and Interface Reference") and the nvidia-cuda-mps-control(1) man page
describe the real one, on the paths the driver uses:

- `-d` starts the control daemon in the background and returns (`-d -M` in
  multi-user mode, as NVIDIA's DRA driver starts it; the log's start line
  then ends in "; multi-user"): the daemon
  reads CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) and
  CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps), creates its pipe
  files `control` and `log` in the pipe directory, writes
  `nvidia-cuda-mps-control.pid` there, and appends to `control.log` in the
  log directory. A second daemon on the same pipe directory refuses to start.
  CUDA_VISIBLE_DEVICES is the devices it manages (logged at start).
- It keeps shared memory in the /dev/shm it sees, where its clients must find
  it: the daemon, the MPS server and the clients talk through named pipes and
  sockets in the pipe directory (NVIDIA's guide, CUDA_MPS_PIPE_DIRECTORY) and
  through POSIX shared memory, the CUDA driver's `cuda.shm.*` files in
  /dev/shm, which is why NVIDIA's DRA driver gives a claim's containers and
  its daemon one /dev/shm. The fake writes one such file,
  `cuda.shm.<daemon pid>.mps`, at start and removes it at `quit`.
- Without arguments it is a client: it reads commands, one per line, from
  stdin, sends each to the daemon of CUDA_MPS_PIPE_DIRECTORY and prints the
  answer. `quit` stops the daemon (its pipe files go);
  `set_default_active_thread_percentage N` and
  `get_default_active_thread_percentage` answer the percentage as a float;
  `set_default_device_pinned_mem_limit <dev> <value>` and
  `get_default_device_pinned_mem_limit <dev>` keep and answer a limit per
  device ordinal (`<dev>` counts the daemon's CUDA_VISIBLE_DEVICES from 0;
  values such as 1024M or 2G).

Where unsure (the real one's exact wording was not at hand): the shared-memory
file's name and when it is made (the real server makes its files when it
starts, at a client's first connection; the fake has no server and makes its
file at once), the answers'
text ("100.0", the stored limit as given, "No limit"), the error lines
("Unrecognized command", "Invalid device", "Cannot find MPS control daemon
process") and the exit status 1 of a client that finds no daemon. The real
control pipe is a named pipe pair; this one is a Unix socket named `control`,
which gives the same liveness test (a client can reach the daemon or not).
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
_LIMIT = re.compile(r"^[0-9]+[MG]$")


def pipe_directory() -> Path:
    """The daemon's pipe directory from the environment, as the real one reads it."""
    return Path(os.environ.get(PIPE_DIRECTORY) or "/tmp/nvidia-mps")


def shm_file(pid: int) -> Path:
    """The shared-memory file the daemon with this pid keeps in the /dev/shm it sees."""
    return Path("/dev/shm") / f"cuda.shm.{pid}.mps"


def _log_directory() -> Path:
    return Path(os.environ.get(LOG_DIRECTORY) or "/var/log/nvidia-mps")


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with (_log_directory() / "control.log").open("a") as log:
        log.write(f"[{stamp} Control {os.getpid()}] {message}\n")


class _Daemon:
    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = list(devices)
        self.percentage = 100.0
        self.limits: dict[int, str] = {}

    def handle(self, line: str) -> tuple[str, bool]:
        """The answer to one command, and whether the daemon goes on."""
        words = line.split()
        if not words:
            return "", True
        _log(f"Command: {line.strip()}")
        command, args = words[0], words[1:]
        if command == "quit" and not args:
            return "", False
        if command == "get_default_active_thread_percentage" and not args:
            return f"{self.percentage:.1f}", True
        if command == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if not 0 < value <= 100:
                return f"Invalid percentage {args[0]}", True
            self.percentage = value
            return f"{value:.1f}", True
        if command in ("set_default_device_pinned_mem_limit", "get_default_device_pinned_mem_limit") and args:
            device = int(args[0]) if args[0].isdigit() else -1
            if not 0 <= device < len(self.devices):
                return f"Invalid device {args[0]}", True
            if command.startswith("get") and len(args) == 1:
                return self.limits.get(device, "No limit"), True
            if command.startswith("set") and len(args) == 2 and _LIMIT.match(args[1]):
                self.limits[device] = args[1]
                return "", True
            return f"Invalid value {' '.join(args[1:])}", True
        return "Unrecognized command", True


def _serve(pipe: Path, devices: Sequence[str], multi_user: bool) -> None:
    daemon = _Daemon(devices)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Relative to the pipe directory: socket paths are limited to 107 bytes, state directories are not.
    os.chdir(pipe)
    server.bind(CONTROL)
    server.listen(8)
    os.mkfifo(pipe / "log")
    (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
    shm = shm_file(os.getpid())
    shm.write_bytes(bytes(4096))
    mode = "; multi-user" if multi_user else ""
    _log(f"Starting control daemon using socket {pipe / CONTROL}; devices {','.join(devices) or 'all'}{mode}")
    running = True
    while running:
        connection, _ = server.accept()
        with connection, connection.makefile("rw") as stream:
            answer, running = daemon.handle(stream.readline())
            stream.write(answer + "\n")
    _log("Exit")
    for path in (pipe / CONTROL, pipe / "log", pipe / PID_FILE, shm):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _send(pipe: Path, line: str) -> str | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            os.chdir(pipe)
            client.connect(CONTROL)
            with client.makefile("rw") as stream:
                stream.write(line + "\n")
                stream.flush()
                return stream.readline().rstrip("\n")
    except OSError:
        return None


def _start_daemon(multi_user: bool) -> int:
    pipe = pipe_directory()
    pipe.mkdir(parents=True, exist_ok=True)
    _log_directory().mkdir(parents=True, exist_ok=True)
    if _send(pipe, "") is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    with contextlib.suppress(FileNotFoundError):
        (pipe / CONTROL).unlink()
    with contextlib.suppress(FileNotFoundError):
        (pipe / "log").unlink()
    devices = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
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
        _serve(pipe, devices, multi_user)
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
        return _start_daemon(multi_user=args == ["-d", "-M"])
    if not args:
        return _client()
    print(f"Usage: nvidia-cuda-mps-control [-d [-M]]; unknown option {' '.join(args)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
