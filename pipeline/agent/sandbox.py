"""The built-in `python` tool: the model's code in a sandboxed subprocess (docs/agent.md, "Sandbox").

Each call writes the code to `main.py` in a fresh temporary folder (removed afterwards) and runs
`python -I -S -B` there (isolated: no PYTHON* variables, no site-packages unless `site_packages`, no
user site, no bytecode written), as its own process group, with an empty environment but PATH,
HOME and TMPDIR (the folder). Enforced by the operating system:
- `unshare -rn --pid --fork --kill-child` where it works (`network: auto` probes it once; `namespace`
  requires it): a network namespace with no interface but a down loopback (no connection reaches
  anything), a PID namespace (every process the code starts dies with it);
- resource limits, set by the child interpreter before the code runs, as hard limits it cannot
  raise: CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS), size of a written file
  (RLIMIT_FSIZE), open files (RLIMIT_NOFILE), no core dumps, and no new processes or threads
  (RLIMIT_NPROC 0; the kernel does not apply it to root);
- a wall-clock limit: the process group is killed (SIGKILL) when it runs past `wall_s` or when the
  call is cancelled (the registry's timeout).
Enforced by an audit hook (`sys.addaudithook`, installed before the code runs; Python's audit hooks
are not a security boundary by design, so this layer stops honest mistakes and casual attempts,
and the OS layer above is what holds): no `open` / listing / removal / renaming outside the folder
(reads of the interpreter's standard library allowed), no sockets, no fork / exec / spawn /
subprocess / os.system / os.kill, no ctypes, no importing `_posixsubprocess`, `_ctypes`, `_socket`.
What the code prints (stdout, then stderr) comes back cut at `max_output_chars`; a non-zero exit,
a kill or a timeout is a `ToolError` carrying that output and the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

from pipeline.agent.tools import ToolError

__all__ = ["PythonTool", "namespace_available"]

logger = logging.getLogger(__name__)

_UNSHARE = ("unshare", "-rn", "--pid", "--fork", "--kill-child")
_NETWORK = ("auto", "namespace", "hook")
_namespace_ok: bool | None = None

# the child's bootstrap: limits, then the audit hook, then the code (argv: limits, read-only roots)
_BOOT = r"""
import sys
def _sandbox(cpu, mem, fsize, nofile, hook, roots):
    import os, resource, signal
    def _cpu(*_):
        os.write(2, b"sandbox: the CPU time limit was reached\n")
        os._exit(152)
    signal.signal(signal.SIGXCPU, _cpu)
    for res, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize),
                       (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, 0)):
        hard = value + 1 if res == resource.RLIMIT_CPU else value
        resource.setrlimit(res, (value, hard))
    if not hook:
        return
    home = os.path.realpath(os.getcwd())
    readable = tuple(os.path.realpath(r) for r in roots) + ("/dev/null", "/dev/urandom")
    realpath, fspath = os.path.realpath, os.fspath
    deny = ("socket.", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
            "os.kill", "os.killpg", "os.chdir", "os.chroot", "os.fchdir", "subprocess.", "ctypes.", "pty.",
            "resource.setrlimit", "resource.prlimit", "os.putenv", "os.unsetenv", "sys.remote_exec")
    blocked = {"_posixsubprocess", "_ctypes", "ctypes", "_socket", "socket", "_multiprocessing", "subprocess"}
    paths = {"os.listdir": 0, "os.scandir": 0, "os.remove": 0, "os.rmdir": 0, "os.mkdir": 0, "os.rename": 0,
             "os.replace": 0, "os.symlink": 0, "os.link": 0, "os.chmod": 0, "os.chown": 0, "os.truncate": 0,
             "os.utime": 0, "shutil.rmtree": 0, "shutil.copyfile": 0, "shutil.move": 0, "glob.glob": 0}
    def inside(p, roots):
        return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)
    def where(p):
        if isinstance(p, int) or p is None:
            return None
        p = fspath(p)
        return realpath(p.decode(errors="replace") if isinstance(p, bytes) else p)
    def audit(event, args):
        if event.startswith(deny):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and args[0] in blocked:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            p = where(args[0])
            if p is None or inside(p, (home,)):
                return
            mode, flags = args[1] or "r", args[2] or 0
            writes = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
            if not writes and inside(p, readable):
                return
            raise PermissionError(f"sandbox: {args[0]!r} is outside the working directory")
        if event in paths:
            for a in args[:2]:
                if isinstance(a, (str, bytes, os.PathLike)):
                    p = where(a)
                    if not inside(p, (home,)) and not (event in ("os.listdir", "os.scandir", "glob.glob") and inside(p, readable)):
                        raise PermissionError(f"sandbox: {a!r} is outside the working directory")
    sys.addaudithook(audit)
_sandbox(*[int(x) for x in sys.argv[1:6]], [r for r in sys.argv[6:] if r])
del _sandbox
sys.argv = ["main.py"]
with open("main.py", encoding="utf-8") as _f:
    _code = compile(_f.read(), "main.py", "exec")
del _f
try:
    exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as _e:  # the traceback without the bootstrap's frames
    import traceback
    _lines = traceback.format_exception(type(_e), _e, _e.__traceback__.tb_next)
    sys.stderr.write("".join(l for l in _lines if not l.startswith('  File "<string>"')))
    sys.exit(1)
"""


def namespace_available() -> bool:
    """Whether `unshare -rn --pid --fork` runs here (probed once per process)."""
    global _namespace_ok
    if _namespace_ok is None:
        try:
            done = subprocess.run([*_UNSHARE, sys.executable, "-I", "-S", "-c", "pass"], capture_output=True,
                                  timeout=10, check=False)
            _namespace_ok = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _namespace_ok = False
        if not _namespace_ok:
            logger.warning("the python tool runs without network / PID namespaces (unshare -rn --pid --fork is not "
                           "available here): sockets are refused by its audit hook only")
    return _namespace_ok


def _stdlib_roots(site_packages: bool) -> list[str]:
    keys = ("stdlib", "platstdlib") + (("purelib", "platlib") if site_packages else ())
    return sorted({sysconfig.get_paths()[k] for k in keys} - {""})


class PythonTool:
    """Run a Python program in a sandbox and return what it prints.

    Args:
        code: the program's source code; print the values you need.
    """

    name = "python"

    def __init__(self, *, cpu_s: int, wall_s: float, memory_mb: int, max_output_chars: int, max_file_mb: int,
                 max_open_files: int, network: str, audit_hook: bool, site_packages: bool) -> None:
        if network not in _NETWORK:
            raise ValueError(f"tool_args.python.network: expected one of {list(_NETWORK)}, got {network!r}")
        for key, value in (("cpu_s", cpu_s), ("wall_s", wall_s), ("memory_mb", memory_mb),
                           ("max_output_chars", max_output_chars), ("max_file_mb", max_file_mb),
                           ("max_open_files", max_open_files)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"tool_args.python.{key}: expected a positive number, got {value!r}")
        self.cpu_s, self.wall_s = int(cpu_s), float(wall_s)
        self.memory_mb, self.max_output_chars = int(memory_mb), int(max_output_chars)
        self.max_file_mb, self.max_open_files = int(max_file_mb), int(max_open_files)
        self.network, self.audit_hook, self.site_packages = network, bool(audit_hook), bool(site_packages)
        if network == "namespace" and not namespace_available():
            raise ValueError("tool_args.python.network=namespace: unshare -rn --pid --fork does not work here; use "
                             "auto (the audit hook alone where namespaces are missing) or hook")

    def command(self) -> list[str]:
        """The argv of one run (the bootstrap, its limits and readable roots)."""
        limits = [self.cpu_s, self.memory_mb * 2 ** 20, self.max_file_mb * 2 ** 20, self.max_open_files,
                  int(self.audit_hook)]
        flags = ["-I", "-B"] + ([] if self.site_packages else ["-S"])
        argv = [sys.executable, *flags, "-c", _BOOT, *map(str, limits), *_stdlib_roots(self.site_packages)]
        use_ns = self.network == "namespace" or (self.network == "auto" and namespace_available())
        return [*_UNSHARE, *argv] if use_ns else argv

    async def __call__(self, code: str) -> str:
        """Run a Python program in a sandbox and return what it prints (stdout, then stderr).

        Args:
            code: the program's source code; print the values you need.
        """
        folder = tempfile.mkdtemp(prefix="agent_python_")
        proc = None
        try:
            with open(os.path.join(folder, "main.py"), "w", encoding="utf-8") as f:
                f.write(code)
            env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"}
            proc = await asyncio.create_subprocess_exec(
                *self.command(), cwd=folder, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
            reading = asyncio.gather(self._read(proc.stdout), self._read(proc.stderr))
            try:
                out, err = await asyncio.wait_for(asyncio.shield(reading), self.wall_s)
                returncode = await proc.wait()
            except TimeoutError:
                self._kill(proc)
                out, err = await reading
                raise ToolError(f"killed after the {self.wall_s:g} s wall-clock limit" + _tail(out, err)) from None
        finally:
            if proc is not None and proc.returncode is None:
                self._kill(proc)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 5)
            shutil.rmtree(folder, ignore_errors=True)
        if returncode == 0:
            return _joined(out, err, self.max_output_chars)
        text = _joined(out, err, self.max_output_chars, tail=True)
        raise ToolError(_reason(returncode, self.cpu_s, self.max_file_mb) + (f"; output:\n{text}" if text else ""))

    async def _read(self, stream: Any) -> bytes:
        """Up to the output cap from `stream`, draining (and dropping) the rest."""
        cap = self.max_output_chars * 4
        kept = bytearray()
        while chunk := await stream.read(65536):
            if len(kept) < cap:
                kept += chunk[: cap - len(kept)]
        return bytes(kept)

    @staticmethod
    def _kill(proc: Any) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _joined(out: bytes, err: bytes, limit: int, tail: bool = False) -> str:
    """stdout then stderr, cut at `limit` characters (the end kept when `tail`: an error's last lines)."""
    text = out.decode("utf-8", errors="replace")
    if err:
        text += ("\n" if text and not text.endswith("\n") else "") + err.decode("utf-8", errors="replace")
    if len(text) <= limit:
        return text
    return f"[output cut to its last {limit} characters] ..." + text[-limit:] if tail else \
        text[:limit] + f"... [output cut at {limit} characters]"


def _tail(out: bytes, err: bytes) -> str:
    text = _joined(out, err, 500, tail=True)
    return f"; output so far:\n{text}" if text else ""


def _reason(code: int, cpu_s: int, file_mb: int) -> str:
    if code == 152:  # the bootstrap's SIGXCPU handler
        return f"stopped at the {cpu_s} s CPU time limit"
    if code < 0:
        sig = -code
        if sig == signal.SIGXCPU or sig == signal.SIGKILL:
            return f"killed ({signal.Signals(sig).name}: past the {cpu_s} s CPU time limit)"
        if sig == signal.SIGXFSZ:
            return f"killed (SIGXFSZ: a file grew past the {file_mb} MB limit)"
        return f"killed by signal {signal.Signals(sig).name}"
    if code == 128 + signal.SIGKILL or code == 128 + signal.SIGXCPU:  # reported through unshare --fork
        return _reason(128 - code, cpu_s, file_mb)
    return f"exited with code {code}"
