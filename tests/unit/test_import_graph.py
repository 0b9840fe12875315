"""No import circles inside the package: every import counts, `TYPE_CHECKING` and function-local ones included.

The layers this keeps: pure math (gae, losses, diagnostics) below the base trainer, the base trainer below the VC-PPO
layer (vcppo_trainer, callbacks). A module that needs the trainer's type annotates with transformers' `Trainer`.
"""

from __future__ import annotations

import ast
import os

from ..paths import REPO as ROOT

PACKAGE = os.path.join(ROOT, "src", "vcppo_trl")


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(PACKAGE))[: -len(".py")].replace(os.sep, ".")
    return rel.removesuffix(".__init__")


def package_import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its body."""
    modules = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                modules[_module_name(path)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(open(path).read())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target in modules and target != name and target != package:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_no_import_circle():
    cycle = find_cycle(package_import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_check_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_local_and_type_checking_imports():
    graph = package_import_graph()
    assert "vcppo_trl.peft_utils" in graph["vcppo_trl.value_model"]  # a function-local import
    assert "vcppo_trl.ppo_trainer" in graph["vcppo_trl.vcppo_trainer"]
    assert "vcppo_trl.ppo_trainer" not in graph["vcppo_trl.distributed"]
    # Pure math imports nothing of the package but the shared masked reductions (and the PPO loss, the losses).
    for module in ("gae", "masked", "diagnostics", "losses", "micro_batches", "dynamic_sampling"):
        assert graph[f"vcppo_trl.{module}"] <= {"vcppo_trl.masked"}, module
    assert graph["vcppo_trl.ppo_loss"] <= {"vcppo_trl.masked", "vcppo_trl.losses"}
    # The value-pretraining phase is plain state and rules; the trainer's parts do not import the trainer.
    assert graph["vcppo_trl.value_pretraining"] == set()
    for part in ("rollout_maker", "learner", "trainer_saving", "trainer_setup", "evaluation"):
        assert not graph[f"vcppo_trl.{part}"] & {"vcppo_trl.ppo_trainer", "vcppo_trl.vcppo_trainer"}, part


def _top_level_names(path: str) -> set[str]:
    names = set()
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` / availability guards
            for inner in node.body:
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    names |= {(alias.asname or alias.name).split(".")[0] for alias in inner.names}
    return names


def test_every_name_imported_from_the_package_exists():
    """Function-local imports run only when their function does: a name moved elsewhere must fail here, not there."""
    modules = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                modules[_module_name(os.path.join(folder, name))] = os.path.join(folder, name)
    missing = []
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(open(path).read())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            if target not in modules:
                continue
            defined = _top_level_names(modules[target])
            for alias in node.names:
                if alias.name not in defined and f"{target}.{alias.name}" not in modules:
                    missing.append(f"{name} imports {alias.name} from {target}")
    assert not missing, missing


def script_import_graph(folder: str) -> dict[str, set[str]]:
    """Scripts of one folder (experiments/, benchmarks/) -> the scripts of that folder they import, anywhere in their
    body: they import each other as top-level modules (the folder is put on `sys.path`)."""
    scripts = {name[: -len(".py")]: os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".py")}
    graph: dict[str, set[str]] = {name: set() for name in scripts}
    for name, path in scripts.items():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in scripts and t != name}
    return graph


def test_experiments_and_benchmarks_have_no_import_circle():
    for folder in ("experiments", "benchmarks"):
        graph = script_import_graph(os.path.join(ROOT, folder))
        cycle = find_cycle(graph)
        assert cycle is None, f"{folder}/: import circle " + " -> ".join(cycle)
    # The report is rebuilt by reproduce.py, and reads everything it needs from its arguments.
    assert "reproduce" not in script_import_graph(os.path.join(ROOT, "experiments"))["report"]


def test_files_stay_readable_and_the_trainer_mixes_in_nothing_of_the_package():
    """No module of the package over 500 lines (the config's field list excepted), and `PPOTrainer` is one class over
    TRL's base: its parts are objects it holds, not classes mixed into its bases."""
    import inspect

    from vcppo_trl import PPOTrainer

    long = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and name != "config.py":
                lines = sum(1 for _ in open(path))
                if lines > 500:
                    long[os.path.relpath(path, PACKAGE)] = lines
    assert long == {}
    mixed_in = [c.__module__ for c in inspect.getmro(PPOTrainer)[1:] if c.__module__.startswith("vcppo_trl")]
    assert mixed_in == []
