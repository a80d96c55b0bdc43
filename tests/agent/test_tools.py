"""Tool registry: schemas from signatures and docstrings, argument checks, timeouts, retries, the
concurrency limit, the allowlist."""

import asyncio
import time

import pytest

from tests.agent import agent_tools
from pipeline.agent.calculator import calculator
from pipeline.agent.sandbox import PythonTool
from pipeline.agent.tools import ToolRegistry, check_arguments, load_tools, tool_from
from pipeline.config.plugins import TargetNotAllowedError

ALLOWED = ["pipeline.", "tests."]


def registry(*paths, **over):
    settings = dict(timeout_s=0.3, retries=2, retry_on=("ConnectionError",), retry_backoff_s=0.0, max_result_chars=60)
    settings.update(over)
    return ToolRegistry(load_tools(list(paths), {}, ALLOWED), **settings)


def test_schema_comes_from_the_signature_and_the_docstring():
    tool = tool_from(agent_tools.typed)
    fn = tool.schema["function"]
    assert fn["name"] == "typed" and fn["description"] == "A tool with typed parameters."
    assert fn["parameters"]["required"] == ["count"]
    props = fn["parameters"]["properties"]
    assert props["count"] == {"type": "integer", "description": "how many."}
    assert props["label"] == {"type": "string", "description": "a name on two lines."}
    assert props["scale"]["type"] == "number" and props["flags"] == {"type": "array", "items": {"type": "string"}}
    calc = tool_from(calculator).schema["function"]
    assert calc["parameters"]["required"] == ["expression"] and "arithmetic" in calc["description"]


def test_a_class_tool_is_built_with_its_tool_args_and_named_by_its_name():
    args = {"python": dict(cpu_s=1, wall_s=2, memory_mb=256, max_output_chars=100, max_file_mb=1, max_open_files=32,
                           network="hook", audit_hook=True, site_packages=False)}
    (tool,) = load_tools(["pipeline.agent.sandbox.PythonTool"], args, ALLOWED)
    assert tool.name == "python" and tool.is_async and isinstance(tool.fn, PythonTool) and tool.fn.cpu_s == 1
    assert tool.schema["function"]["parameters"]["required"] == ["code"]
    with pytest.raises(ValueError, match=r"tools\[0\]: building the tool class .*tool_args.python failed"):
        load_tools(["pipeline.agent.sandbox.PythonTool"], {}, ALLOWED)


def test_tools_go_through_the_allowlist():
    with pytest.raises(TargetNotAllowedError, match="agent tool .*'os.system' is not allowed"):
        load_tools(["os.system"], {}, ALLOWED)
    with pytest.raises(TargetNotAllowedError, match="allowed_targets_extra"):
        load_tools(["tests.agent.agent_tools.slow"], {}, ["pipeline."])
    with pytest.raises(ValueError, match=r"a second tool named 'slow'"):
        load_tools(["tests.agent.agent_tools.slow", "tests.agent.agent_tools.slow"], {}, ALLOWED)


@pytest.mark.parametrize("arguments, problem", [
    ({}, "missing 'count'"), ({"count": 1, "size": 2}, "unknown 'size'"), ({"count": "3"}, "'count' must be integer"),
    ({"count": True}, "'count' must be integer"), ({"count": 1, "scale": "big"}, "'scale' must be number"),
    ([1], "arguments must be a JSON object"),
])
def test_arguments_are_checked_against_the_schema(arguments, problem):
    assert problem in check_arguments(tool_from(agent_tools.typed), arguments)


def test_fitting_arguments_pass():
    assert check_arguments(tool_from(agent_tools.typed), {"count": 2, "scale": 3}) is None


def _call(reg, name, arguments, limit=4):
    async def go():
        return await reg.call(name, arguments, asyncio.Semaphore(limit))
    return asyncio.run(go())


def test_a_hanging_tool_times_out_as_an_error_and_results_are_cut():
    reg = registry("tests.agent.agent_tools.hangs", "tests.agent.agent_tools.typed")
    start = time.perf_counter()
    out = _call(reg, "hangs", {"expression": "1"})
    assert out.error and out.timed_out and out.text == "Error: hangs timed out after 0.3 s"
    assert time.perf_counter() - start < 2.0 and out.attempts == 1  # TimeoutError is not in retry_on
    long = _call(reg, "typed", {"count": 1, "label": "y" * 200})
    assert not long.error and long.text.startswith('{"count": 1') and "more characters cut" in long.text


def test_transient_errors_are_retried_and_others_are_not():
    agent_tools.reset()
    out = _call(registry("tests.agent.agent_tools.flaky"), "flaky", {"expression": "2 + 2"})
    assert not out.error and out.text == "4" and out.attempts == 3
    agent_tools.reset()
    out = _call(registry("tests.agent.agent_tools.flaky", retries=1), "flaky", {"expression": "2 + 2"})
    assert out.error and out.text == "Error: flaky failed: ConnectionError: connection reset" and out.attempts == 2
    out = _call(registry("tests.agent.agent_tools.broken"), "broken", {"expression": "1"})
    assert out.error and out.text == "Error: broken failed: the backend is down" and out.attempts == 1


def test_the_semaphore_limits_concurrent_calls():
    agent_tools.reset()
    reg = registry("tests.agent.agent_tools.slow")

    async def go():
        sem = asyncio.Semaphore(3)
        return await asyncio.gather(*(reg.call("slow", {"expression": f"{i} + 1"}, sem) for i in range(10)))

    outs = asyncio.run(go())
    assert [o.text for o in outs] == [str(i + 1) for i in range(10)]
    assert agent_tools.RUNNING["max"] == 3


def test_a_partial_is_named_and_documented_by_its_function_without_its_bound_arguments():
    import functools
    tool = tool_from(functools.partial(agent_tools.typed, label="y"))
    assert tool.name == "typed" and tool.schema["function"]["description"] == "A tool with typed parameters."
    assert tool.params["count"] == {"type": "integer", "description": "how many."} and tool.required == ("count",)
