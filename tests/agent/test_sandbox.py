"""The python tool's sandbox: escape attempts end as tool errors within the limits, and the run goes on.

With the audit hook on (the default) every attempt is refused or killed; with it off, the checks
marked "OS" show what the operating system holds by itself (network namespace, RLIMIT_AS,
RLIMIT_CPU, the wall-clock kill, RLIMIT_NPROC where the kernel applies it: not for root)."""

import asyncio
import glob
import os
import socket
import tempfile
import time

import pytest

from pipeline.agent.sandbox import PythonTool, namespace_available
from pipeline.agent.tools import ToolError, ToolRegistry, tool_from

LIMITS = dict(cpu_s=1, wall_s=1.5, memory_mb=256, max_output_chars=200, max_file_mb=1, max_open_files=32,
              network="auto", audit_hook=True, site_packages=False)


def run(code, **over):
    return asyncio.run(PythonTool(**{**LIMITS, **over})(code))


def outcome(code, **over):
    """('ok', output) or ('error', message) and the seconds it took."""
    start = time.perf_counter()
    try:
        result = ("ok", run(code, **over))
    except ToolError as exc:
        result = ("error", str(exc))
    return result, time.perf_counter() - start


def test_it_runs_code_in_a_throwaway_folder():
    out = run("import os, math\nopen('notes.txt', 'w').write('hi')\nprint(open('notes.txt').read(), math.factorial(5))\n"
              "print(os.getcwd())")
    lines = out.splitlines()
    assert lines[0] == "hi 120" and os.path.basename(lines[1]).startswith("agent_python_")
    assert not os.path.exists(lines[1])  # removed afterwards
    assert run("print('x' * 1000)").endswith("[output cut at 200 characters]")


@pytest.mark.parametrize("name, code, message", [
    ("read outside", "print(open('/etc/hostname').read())", "outside the working directory"),
    ("write outside", f"open({tempfile.gettempdir()!r} + '/agent_escape.txt', 'w').write('x')",
     "outside the working directory"),
    ("list outside", "import os\nprint(os.listdir('/root'))", "outside the working directory"),
    ("socket", "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)", "importing socket is not allowed"),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", "os.fork is not allowed"),
    ("subprocess", "import os\nos.system('echo hi > /tmp/agent_escape2')", "os.system is not allowed"),
    ("ctypes", "import ctypes", "importing ctypes is not allowed"),
    ("raise limits", "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))", "not allowed"),
    ("infinite loop", "while True:\n    pass", "limit"),  # CPU time, or wall clock on a crowded machine
    ("sleeps", "import time\ntime.sleep(60)", "wall-clock limit"),
    ("10 GB", "x = bytearray(10 * 2 ** 30)", "MemoryError"),
    ("big file", "open('big', 'wb').write(b'x' * (4 * 2 ** 20))", "File too large"),
])
def test_escape_attempts_end_as_tool_errors_within_the_limits(name, code, message):
    (kind, text), seconds = outcome(code)
    assert kind == "error" and message in text, (name, text)
    assert seconds < LIMITS["wall_s"] + 2
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), "agent_escape.txt"))
    assert not os.path.exists("/tmp/agent_escape2")


@pytest.mark.skipif(not namespace_available(), reason="no network namespace (unshare -rn) here")
def test_os_the_network_namespace_reaches_nothing_even_without_the_audit_hook():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    try:
        (kind, text), _ = outcome(f"import socket\ns = socket.socket()\nprint(s.connect_ex(('127.0.0.1', {port})))",
                                  audit_hook=False)
        assert kind == "ok" and text.strip() not in ("", "0")  # an errno: unreachable, never connected
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_os_limits_hold_without_the_audit_hook():
    for code, message, wall in (("x = bytearray(10 * 2 ** 30)", "MemoryError", 3),
                                ("while True:\n    pass", "1 s CPU time limit", 20),
                                ("import time\ntime.sleep(60)", "wall-clock limit", 1)):
        (kind, text), seconds = outcome(code, audit_hook=False, wall_s=wall)
        assert kind == "error" and message in text and seconds < wall + 2, text
    if os.geteuid() != 0:  # the kernel does not apply RLIMIT_NPROC to root
        (kind, text), _ = outcome("import os\nos.fork()", audit_hook=False)
        assert kind == "error" and "BlockingIOError" in text


def _sandbox_processes():
    found = []
    for link in glob.glob("/proc/[0-9]*/cwd"):
        try:
            if os.path.basename(os.readlink(link)).startswith("agent_python_"):
                found.append(link)
        except OSError:
            pass
    return found


def test_a_cancelled_call_kills_its_process_and_the_run_goes_on():
    tool = tool_from(PythonTool(**{**LIMITS, "cpu_s": 30, "wall_s": 30}))
    reg = ToolRegistry([tool], timeout_s=0.5, retries=0, retry_on=(), retry_backoff_s=0, max_result_chars=200)

    async def go():
        sem = asyncio.Semaphore(4)
        return await asyncio.gather(reg.call("python", {"code": "while True:\n    pass"}, sem),
                                    reg.call("python", {"code": "print(6 * 7)"}, sem))

    start = time.perf_counter()
    hung, fine = asyncio.run(go())
    assert hung.error and hung.timed_out and fine.text == "42\n" and time.perf_counter() - start < 5
    deadline = time.time() + 3
    while _sandbox_processes() and time.time() < deadline:
        time.sleep(0.05)
    assert _sandbox_processes() == []
