"""A Python code-interpreter tool for TRL's `tools=`: model-written code run in a child process with limits.

Why a child process: the trainer runs a user's tools in its own process, with its own rights (sync tools in threads),
and it does not sandbox them. Code the policy wrote must not run there: an `exec` in the trainer can read its memory
and its secrets, change its state, hang a thread past `tool_timeout` for good (Python cannot stop a thread) or take
all its memory. [`run_python`] never runs the code in the calling process; it starts a fresh interpreter each call:

- `python -I -B` (isolated: no `PYTHON*` variables, no user site-packages, the code's folder not on `sys.path`; no
  `.pyc` written into the trainer's installation); the trainer's site-packages stay importable (numpy, sympy, ... if
  installed);
- in a fresh temporary working directory, removed afterwards with whatever the code wrote there;
- with a small explicit environment (no variable of the trainer's is inherited: no `HF_TOKEN`, no cloud keys),
  stdin closed (`input()` gets `EOFError`), no file descriptor of the trainer's but the captured output;
- a wall-clock `timeout`, after which the child's whole process group (its own session) is killed; whatever the
  code left running in that group is killed when the child returns;
- on POSIX, limits the child sets on itself before the code starts, soft and hard alike: `RLIMIT_AS` (address space,
  `memory_mb`: an allocation past it raises `MemoryError`; Linux enforces it, macOS does not), `RLIMIT_CPU` (CPU
  seconds, a little above the timeout: every process the code starts inherits it, even one that leaves the group) and `RLIMIT_FSIZE` (any file it writes,
  its captured output included, at most `MAX_FILE_MB`). They are set in the child, not in a `preexec_fn`: the trainer
  calls tools from threads, where `preexec_fn` is not safe. `RLIMIT_NPROC` is not set: it counts every process and
  thread of the user on the machine, so no value means "a few more for this call".

What it does NOT do: it is no security sandbox against a hostile model. The code runs as the trainer's user, with the
network, the whole filesystem the user can read and write (the temporary directory is only its starting point), and
the rights to start processes that leave its process group. To train on code from a model you do not trust, run the
code in a container or a VM (e.g. a locked-down Docker container with no network and a read-only filesystem, or
gVisor/Firecracker), from a tool of your own.

[`python_tool`] binds the limits into a tool function (`python(code: str) -> str`) whose docstring transformers turns
into the schema the chat template shows the policy.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

try:
    import resource
except ImportError:  # not POSIX (Windows): no memory or CPU limits
    resource = None

MIN_MEMORY_MB = 16  # the interpreter alone takes about 12 MiB of address space
MIN_OUTPUT_CHARS = 100  # room for the truncation marker and some output
MAX_FILE_MB = 64  # RLIMIT_FSIZE: any file the code writes, its captured output included

# Runs in the child: set the limits on itself (soft = hard, so the code cannot raise them), then run the code as
# `__main__`. Everything it needs is imported before the memory limit applies.
_BOOTSTRAP = """
import json, runpy, sys
limits = json.loads(sys.argv[1])
if limits:
    import resource
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
path = sys.argv[2]
sys.argv = ["<code>"]
del json, limits
runpy.run_path(path, run_name="__main__")
"""


def _check(timeout: float, memory_mb: int | None, max_output_chars: int) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"`timeout` must be a positive number of seconds, got {timeout!r}.")
    if memory_mb is not None:
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < MIN_MEMORY_MB:
            raise ValueError(
                f"`memory_mb` must be None (no limit) or an int >= {MIN_MEMORY_MB} (MiB of address space), "
                f"got {memory_mb!r}."
            )
        if resource is None:
            raise ValueError(
                "`memory_mb`: the memory limit needs POSIX (Python's `resource` module), which this platform lacks; "
                "pass memory_mb=None to run without one (the timeout still applies)."
            )
    if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int):
        raise ValueError(f"`max_output_chars` must be an int, got {max_output_chars!r}.")
    if max_output_chars < MIN_OUTPUT_CHARS:
        raise ValueError(f"`max_output_chars` must be >= {MIN_OUTPUT_CHARS}, got {max_output_chars}.")


def _limits(timeout: float, memory_mb: int | None) -> dict[str, int]:
    """The rlimits the child sets on itself, each within the hard limit this process already has."""
    if resource is None:
        return {}
    wanted = {"RLIMIT_CPU": math.ceil(timeout) + 1, "RLIMIT_FSIZE": MAX_FILE_MB * 2**20}
    if memory_mb is not None:
        wanted["RLIMIT_AS"] = memory_mb * 2**20
    limits = {}
    for name, value in wanted.items():
        if not hasattr(resource, name):
            continue
        hard = resource.getrlimit(getattr(resource, name))[1]
        limits[name] = value if hard == resource.RLIM_INFINITY else min(value, hard)
    return limits


def _environment(workdir: str) -> dict[str, str]:
    """A small explicit environment: nothing of the trainer's is inherited (no tokens or keys)."""
    env = {
        "PATH": os.defpath,
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        # One thread per math library: threads reserve address space that a memory limit counts.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
    }
    if os.name == "nt" and "SYSTEMROOT" in os.environ:  # Windows' interpreter does not start without it
        env["SYSTEMROOT"] = os.environ["SYSTEMROOT"]
    return env


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the child and everything still in its process group (its session, on POSIX)."""
    if os.name == "posix":
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already
    elif process.poll() is None:
        process.kill()


def _read(path: str, max_chars: int) -> str:
    """The file's text, or, when it is longer than `max_chars` could show, its start and its end (a UTF-8 character
    is at most 4 bytes): never the whole of a large output in this process's memory."""
    size, span = os.path.getsize(path), 4 * max_chars
    with open(path, "rb") as f:
        if size <= 2 * span:
            return f.read().decode("utf-8", errors="replace")
        head = f.read(span)
        f.seek(size - span)
        tail = f.read(span)
    return head.decode("utf-8", errors="replace") + "\n[...]\n" + tail.decode("utf-8", errors="replace")


def _fit(text: str, budget: int) -> str:
    """`text` in at most `budget` characters: its start and its end around a marker saying that it was cut."""
    if len(text) <= budget:
        return text
    marker = f"\n[... output truncated: it was longer than {budget} characters ...]\n"
    keep = max(budget - len(marker), 0)
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head) :]


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _ending(returncode: int, stderr: str, *, timeout: float, timed_out: bool) -> str:
    """What went wrong, in one line ("" when the code ran to its end)."""
    if timed_out:
        return f"Timed out after {timeout:g} s (the process was killed)."
    if returncode == 0:
        return ""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name == "SIGXCPU":
            return "CPU time limit exceeded (the process was killed)."
        return _last_line(stderr) or f"Killed by {name} (out of memory?)."
    return _last_line(stderr) or f"Exited with status {returncode}."


def run_python(code: str, *, timeout: float = 10.0, memory_mb: int | None = 512, max_output_chars: int = 2000) -> str:
    """
    Run Python code in a fresh child process with a time and memory limit, and return what the model should read: the
    code's stdout, followed, when it failed, by one line saying how (the last line of its traceback, e.g.
    `"ZeroDivisionError: division by zero"`, `"MemoryError"`, or `"Timed out after 10 s (the process was killed)."`).
    Nothing runs in this process; see the module's docstring for what the limits do and do not do.

    Args:
        code (`str`): The Python source to run as `__main__`.
        timeout (`float`, *optional*, defaults to `10.0`): Wall-clock seconds, interpreter start included, after
            which the child's whole process group is killed.
        memory_mb (`int` or `None`, *optional*, defaults to `512`): The child's address-space limit in MiB
            (`RLIMIT_AS`, POSIX only; `None`: no limit, required where the `resource` module is missing).
        max_output_chars (`int`, *optional*, defaults to `2000`): The most characters returned; longer output keeps
            its start and end around a marker saying it was cut (the failure line is always kept).

    Returns:
        `str`: the result text; `"(no output)"` when the code printed nothing and ran to its end.
    """
    if not isinstance(code, str):
        raise TypeError(f"`code` must be a string of Python source, got {type(code).__name__}.")
    _check(timeout, memory_mb, max_output_chars)
    limits = _limits(timeout, memory_mb)
    with tempfile.TemporaryDirectory(prefix="vcppo-python-") as root:
        workdir = os.path.join(root, "work")
        os.mkdir(workdir)
        script, out_path, err_path = (os.path.join(root, name) for name in ("code.py", "stdout", "stderr"))
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            # Output goes to files, not pipes: its size is bounded by RLIMIT_FSIZE, never by this process's memory,
            # and a grandchild holding the pipe cannot keep this call waiting.
            process = subprocess.Popen(
                [sys.executable, "-I", "-B", "-X", "utf8", "-c", _BOOTSTRAP, json.dumps(limits), script],
                cwd=workdir,
                env=_environment(workdir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                close_fds=True,
                start_new_session=True,
            )
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(process)  # on time out, and whatever the code left running in its group
                process.wait()
        stdout, stderr = _read(out_path, max_output_chars), _read(err_path, max_output_chars)
    ending = _ending(process.returncode, stderr, timeout=timeout, timed_out=timed_out)
    stdout = stdout.rstrip()
    if not ending:
        return _fit(stdout, max_output_chars) if stdout else "(no output)"
    ending = _fit(ending, max_output_chars // 2)
    if not stdout:
        return ending
    return _fit(stdout, max_output_chars - len(ending) - 1) + "\n" + ending


def python_tool(
    *, timeout: float = 10.0, memory_mb: int | None = 512, max_output_chars: int = 2000, name: str = "python"
) -> Callable[[str], str]:
    """
    A code-interpreter tool for `tools=[...]`: a function `python(code: str) -> str` (named `name`) that runs the code
    with [`run_python`] and these limits, with a docstring from which transformers' `get_json_schema` builds its
    schema (one required string parameter, `code`). A plain function, as `apply_chat_template` requires (like any
    closure it does not pickle); safe to call from the tool loop's threads, each call its own child. Keep `timeout`
    below the trainer's `tool_timeout`, so that the child is killed before the loop gives up on the call.

    Args:
        timeout, memory_mb, max_output_chars: As in [`run_python`] (checked here).
        name (`str`, *optional*, defaults to `"python"`): The tool's name, as the policy calls it.
    """
    _check(timeout, memory_mb, max_output_chars)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"`name` must be a Python identifier (the tool's name), got {name!r}.")
    memory = "no memory limit" if memory_mb is None else f"{memory_mb} MB of memory"

    def python(code: str) -> str:
        return run_python(code, timeout=timeout, memory_mb=memory_mb, max_output_chars=max_output_chars)

    python.__name__ = python.__qualname__ = name
    python.__doc__ = (
        "Run Python code in a fresh Python interpreter and return what it printed.\n\n"
        "Nothing is kept between calls, so include every import and definition; print() the values you want to see. "
        f"The code gets {timeout:g} seconds and {memory}; its output is cut to {max_output_chars} characters. "
        "If it fails, the last line is the error.\n\n"
        "Args:\n"
        "    code: The Python source code to run."
    )
    return python
