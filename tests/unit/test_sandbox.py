"""The Python code-interpreter tool (issue 48, faults and bad input): model-written code runs in a child process with a
time and memory limit, in a temporary directory, without the trainer's environment, and answers text the policy can
read. Each call starts a bare `python -I` (tens of milliseconds)."""

from __future__ import annotations

import inspect
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from vcppo_trl.episodes import sandbox
from vcppo_trl.episodes.sandbox import python_tool, run_python

LINUX = sys.platform.startswith("linux")


def test_what_the_code_prints_comes_back():
    assert run_python("print('hello')\nprint(1 + 1)") == "hello\n2"
    assert run_python("x = 1") == "(no output)"
    assert run_python("import sys\nprint('to stderr', file=sys.stderr)\nprint('out')") == "out"


def test_an_exception_answers_its_last_traceback_line_after_the_output():
    assert run_python("1 / 0") == "ZeroDivisionError: division by zero"
    assert run_python("print('before')\nraise ValueError('boom')") == "before\nValueError: boom"
    assert run_python("print(undefined)") == "NameError: name 'undefined' is not defined"
    assert run_python("def f(:\n  pass").startswith("SyntaxError")
    assert run_python("import sys\nsys.exit(3)") == "Exited with status 3."
    assert run_python("input()") == "EOFError: EOF when reading a line"  # stdin is closed


def test_the_code_runs_in_another_process():
    pid = int(run_python("import os\nprint(os.getpid())"))
    assert pid != os.getpid()


def test_an_endless_loop_is_stopped_by_the_timeout():
    start = time.monotonic()
    result = run_python("print('started', flush=True)\nwhile True:\n    pass", timeout=1.0)
    elapsed = time.monotonic() - start
    assert result == "started\nTimed out after 1 s (the process was killed)."
    assert elapsed < 5


@pytest.mark.skipif(not LINUX, reason="RLIMIT_AS is enforced on Linux (macOS ignores it)")
def test_allocating_past_the_memory_limit_answers_memory_error():
    assert run_python("x = bytearray(8 * 2**30)", memory_mb=64) == "MemoryError"
    assert run_python("x = [0] * 10**9", memory_mb=64) == "MemoryError"
    assert run_python("x = bytearray(32 * 2**20)\nprint(len(x))", memory_mb=256) == str(32 * 2**20)  # under it


@pytest.mark.skipif(not LINUX, reason="/proc")
def test_processes_the_code_leaves_running_are_killed():
    code = "import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\nprint(p.pid)"
    pid = int(run_python(code))
    time.sleep(0.2)
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z", "X")  # killed (a zombie until whoever adopted it reaps it)


def test_long_output_is_truncated_with_a_marker_keeping_its_start_end_and_the_error():
    result = run_python("print('a' * 5000 + 'b' * 5000)", max_output_chars=300)
    assert len(result) <= 300 and "output truncated" in result
    assert result.startswith("a") and result.endswith("b")
    result = run_python("print('x' * 10000)\nraise ValueError('boom')", max_output_chars=300)
    assert len(result) <= 300 and "output truncated" in result and result.endswith("\nValueError: boom")
    result = run_python("while True:\n    print('y' * 1000)", timeout=1.0, max_output_chars=500)
    assert len(result) <= 500 and result.startswith("yyy")  # a flood is cut (and bounded on disk by RLIMIT_FSIZE)


def test_the_code_runs_in_a_temporary_directory_that_is_removed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    workdir = run_python("import os\nopen('note.txt', 'w').write('x')\nprint(os.getcwd())")
    assert os.path.isabs(workdir) and workdir != str(tmp_path)
    assert not os.path.exists(workdir)
    assert not os.path.exists(tmp_path / "note.txt") and list(tmp_path.iterdir()) == []


def test_the_trainers_environment_is_not_inherited(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("PYTHONPATH", "/nowhere")
    assert run_python("import os\nprint(os.environ.get('HF_TOKEN'))") == "None"
    names = run_python("import os\nprint(sorted(os.environ))")
    assert "HF_TOKEN" not in names and "PYTHONPATH" not in names
    assert run_python("import sys\nprint('/nowhere' in sys.path)") == "False"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(timeout=0), "`timeout` must be a positive number"),
        (dict(timeout=-1.0), "`timeout` must be a positive number"),
        (dict(timeout=float("nan")), "`timeout` must be a positive number"),
        (dict(timeout=True), "`timeout` must be a positive number"),
        (dict(memory_mb=8), r"`memory_mb` must be None \(no limit\) or an int >= 16"),
        (dict(memory_mb=64.0), "`memory_mb` must be None"),
        (dict(max_output_chars=10), "`max_output_chars` must be >= 100"),
        (dict(max_output_chars="2000"), "`max_output_chars` must be an int"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_python("print(1)", **kwargs)
    with pytest.raises(ValueError, match=message):
        python_tool(**kwargs)


def test_code_that_is_not_text_and_a_bad_tool_name_are_refused():
    with pytest.raises(TypeError, match="`code` must be a string"):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="`name` must be a Python identifier"):
        python_tool(name="run code")


def test_without_posix_a_memory_limit_is_refused_and_none_runs(monkeypatch):
    monkeypatch.setattr(sandbox, "resource", None)
    with pytest.raises(ValueError, match=r"needs POSIX.*memory_mb=None"):
        run_python("print(1)")
    with pytest.raises(ValueError, match="memory_mb=None"):
        python_tool()
    assert run_python("print(1)", memory_mb=None) == "1"


def test_the_tool_has_a_schema_and_runs_with_its_limits_from_threads():
    from transformers.utils import get_json_schema

    tool = python_tool()
    assert inspect.isfunction(tool) and tool.__name__ == "python"  # what apply_chat_template accepts
    schema = get_json_schema(tool)
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "python" and "10 seconds" in function["description"]
    assert function["parameters"]["properties"]["code"]["type"] == "string"
    assert function["parameters"]["required"] == ["code"]
    assert get_json_schema(python_tool(name="run_code", memory_mb=None))["function"]["name"] == "run_code"

    quick = python_tool(timeout=1.0, max_output_chars=100)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(quick, [f"print({i} * 7)" for i in range(4)] + ["while True:\n    pass"]))
    assert results[:4] == ["0", "7", "14", "21"] and results[4].startswith("Timed out after 1 s")
