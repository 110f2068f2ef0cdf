"""`python -m tunebook.servers.sglang_launch ARGS…`: SGLang's server (`sglang.launch_server ARGS…`)
with the API key taken from the environment (tunebook.servers.sglang.KEY_ENV) instead of the command
line, where every user of the machine could read it and tunebook would store it.

SGLang prints its whole ServerArgs at start, `api_key='…'` included (seen on the H200), and
its processes write straight to the log's file descriptors. So the server runs in a forked
child whose stdout and stderr are a pipe, and this process copies the pipe into the log with
the key replaced by `***`: every process SGLang starts inherits the pipe, so nothing it
prints reaches the log unredacted. SIGTERM/SIGINT are passed on to the child (a stop of the
process group reaches it anyway; a stop of this process alone, e.g. PR_SET_PDEATHSIG under
Ray, must too), and this process exits with the child's status once the pipe closes."""

from __future__ import annotations

import os
import runpy
import signal
import sys

KEY_ENV = "TUNEBOOK_SGLANG_API_KEY"  # the key travels here (servers.sglang imports this name)
MODULE_ENV = "TUNEBOOK_SGLANG_MODULE"  # tests: the module to run instead of SGLang's server
MASK = b"***"


def _held_back(buf: bytes, key: bytes) -> int:
    """Where buf may be cut: its longest tail that could begin the key stays for the next
    read (a key split across two reads is masked too); output is otherwise not delayed."""
    for n in range(min(len(key) - 1, len(buf)), 0, -1):
        if key.startswith(buf[-n:]):
            return len(buf) - n
    return len(buf)


def _copy_redacted(fd: int, key: bytes, out: int) -> None:
    """Copy fd to out until EOF, every occurrence of key replaced by MASK."""
    tail = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        buf = (tail + chunk).replace(key, MASK) if key else chunk
        cut = _held_back(buf, key) if key else len(buf)
        _write_all(out, buf[:cut])
        tail = buf[cut:]
    _write_all(out, tail)


def _write_all(out: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(out, view):]


def _exit_like(status: int) -> int:
    """End as the server ended: killed by the same signal (a SIGKILL from the OOM killer stays
    'exit code -9' for tunebook), else with its exit code."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:  # (SIGKILL's handler cannot be set: it kills regardless)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig  # a signal that does not end a process by default
    return os.waitstatus_to_exitcode(status)


def main() -> int:
    key = os.environ.pop(KEY_ENV, None)
    module = os.environ.pop(MODULE_ENV, None) or "sglang.launch_server"
    # the version line tunebook.servers.sglang.parse_startup reads (SGLang prints none of its own)
    try:
        from importlib.metadata import version

        print(f"tunebook: sglang {version('sglang')}", flush=True)
    except Exception:  # noqa: BLE001 - a wheel without metadata (or none here): the row says None
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the server
        os.close(read_fd)
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        if key:
            sys.argv += ["--api-key", key]  # this process's argv only; /proc shows the original
        sys.argv[0] = module
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - print it into the (redacted) log, then exit 1
            import traceback

            traceback.print_exc()
            code = 1
        else:
            code = 0
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(write_fd)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    _copy_redacted(read_fd, key.encode() if key else b"", sys.stdout.fileno())
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return _exit_like(status)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0


if __name__ == "__main__":
    sys.exit(main())
