"""No part but the trainer reads the whole config: outside `config/` and `trainer/` a function takes the fields it uses,
or a frozen settings view built by a `from_args` classmethod (docs/architecture.md, "Settings"). Checked on the source:
no parameter annotated with a config or trainer class, and no parameter named `args` or `trainer` whose attributes the
function reads (an unannotated config passed in)."""

from __future__ import annotations

import ast
import os
import re

from ..paths import REPO

PACKAGE = os.path.join(REPO, "src", "vcppo_trl")
# Not transformers' `TrainingArguments`: a `TrainerCallback`'s hooks are handed them (the toy cold start's SFT run).
WHOLE_TYPES = {"PPOConfig", "VCPPOConfig", "VAPOConfig", "Trainer", "PPOTrainer", "VCPPOTrainer", "VAPOTrainer"}
WHOLE_NAMES = {"args", "trainer"}
# Where the whole config is read: the configs, the trainer that builds the parts from them, and the command line's
# body (`cli/`), which parses it, builds the trainer and runs its job.
READERS = ("config/", "trainer/", "cli/")


def whole_config_parameters(source: str) -> list[str]:
    """`function(parameter)` for each parameter that takes the whole config or trainer, outside `from_args`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name == "from_args":
            continue
        params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        read = set()  # names whose attributes are read: `args.x`, `getattr(args, "x")`, `hasattr(args, "x")`
        for inner in ast.walk(node):
            if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name):
                read.add(inner.value.id)
            elif (
                isinstance(inner, ast.Call)
                and getattr(inner.func, "id", None) in ("getattr", "hasattr")
                and inner.args
            ):
                read.add(getattr(inner.args[0], "id", None))
        for param in params:
            annotation = ast.unparse(param.annotation) if param.annotation is not None else ""
            if set(re.findall(r"\w+", annotation)) & WHOLE_TYPES or (param.arg in WHOLE_NAMES and param.arg in read):
                found.append(f"{node.name}({param.arg})")
    return found


def test_no_part_outside_the_trainer_takes_the_whole_config():
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
            # A folder's `settings.py` is its view of the config: `from_args` and what it derives from the fields.
            if not name.endswith(".py") or relative.startswith(READERS) or name == "settings.py":
                continue
            if hits := whole_config_parameters(open(path).read()):
                found[relative] = hits
    assert found == {}, f"parts that take the whole config or trainer (pass the fields, or settings): {found}"


def test_the_check_sees_annotations_and_read_args_and_allows_from_args():
    source = """
def a(x, args: PPOConfig): ...
def b(settings, trainer: "Trainer | None"): ...
def c(args):
    return args.learning_rate
def c2(args):
    return getattr(args, "sequence_parallel_size", 1)
def d(module, args, output):  # a forward hook's inputs: passed on, not read
    return output
class S:
    @classmethod
    def from_args(cls, args: PPOConfig):
        return cls(args.seed)
"""
    assert whole_config_parameters(source) == ["a(args)", "b(trainer)", "c(args)", "c2(args)"]
