"""The package's house rules: no import circles (every import counts, `TYPE_CHECKING` and function-local ones
included), folders that import only the folders below them in `LAYERS`, public faces, and files a reader can hold.

A module that needs the trainer's type annotates with transformers' `Trainer`.
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


# The package's folders from the top ring to the bottom one: a folder imports only folders below it (and itself).
# The top level (`vcppo_trl/__init__.py` and the one-line import paths kept for users) sits above them all.
LAYERS = (
    "cli",  # the body of `python train.py`: options, --help, datasets, model and tools, its three jobs, process exit
    "toy",  # the embedded default task, tiny model and cold start: built from rewards, models and diagnostics
    "trainer",  # the loop, presets, setup, metrics, evaluation, value pretraining, prompts, console, saving, resuming
    "checkpoint",  # checkpoint files, universal checkpoints, Hub pushes, model cards
    "learner",  # PPO epochs over one rollout; optimizers and schedules
    "rollout",  # the Rollout type and its maker, scoring, per-token reward shaping, the rollout sources
    "episodes",  # how a prompt becomes an episode: one turn, the tool loop, environments, a rollout_func; the sandbox
    "sampling",  # the sampler seam, HF and vLLM samplers
    "rewards",  # reward calls, math-verify, the verifier worker, reward models
    "models",  # policy-and-value module, log-probs, value model, PEFT, packing, loading
    "config",  # PPOConfig, VCPPOConfig, VAPOConfig, the batch plan
    "parallel",  # collectives across processes and launch checks
    "algo",  # pure tensor functions
)
TOP_MODULES_AT_MOST = 8


def folder_of(module: str) -> str | None:
    """The package folder a module belongs to (None: the top level)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def test_every_folder_is_in_the_table_and_the_top_level_is_small():
    folders = sorted(
        name
        for name in os.listdir(PACKAGE)
        if os.path.isdir(os.path.join(PACKAGE, name)) and os.path.exists(os.path.join(PACKAGE, name, "__init__.py"))
    )
    assert folders == sorted(LAYERS)
    top = sorted(name for name in os.listdir(PACKAGE) if name.endswith(".py") and name != "__init__.py")
    assert len(top) <= TOP_MODULES_AT_MOST, top


def test_no_folder_imports_a_folder_above_it():
    rank = {folder: i for i, folder in enumerate(LAYERS)}
    upward = []
    for module, targets in package_import_graph().items():
        source = folder_of(module)
        if source is None:
            continue
        for target in targets:
            folder = folder_of(target)
            if folder is None:
                upward.append(f"{module} imports the top level's {target}")
            elif rank[folder] < rank[source]:
                upward.append(f"{module} ({source}) imports {target} ({folder}, above it)")
    assert not upward, "\n".join(sorted(upward))


def test_the_layer_check_finds_an_upward_import():
    assert folder_of("vcppo_trl.algo.gae") == "algo"
    assert folder_of("vcppo_trl.algo") == "algo"
    assert folder_of("vcppo_trl.cli") == "cli" and folder_of("vcppo_trl.cli.jobs") == "cli"
    assert folder_of("vcppo_trl.gae") is None and folder_of("vcppo_trl") is None
    assert LAYERS.index("trainer") < LAYERS.index("algo")  # trainer imports algo, never the reverse


def test_the_graph_sees_local_and_type_checking_imports():
    graph = package_import_graph()
    assert "vcppo_trl.models.critic_peft" in graph["vcppo_trl.models.value_model"]  # a function-local import
    assert "vcppo_trl.trainer.ppo" in graph["vcppo_trl.trainer.vcppo"]
    # Pure math imports nothing of the package outside algo/, and algo/ imports only torch besides the standard library.
    for module, targets in graph.items():
        if folder_of(module) == "algo":
            assert {folder_of(t) for t in targets} <= {"algo"}, module
    # The value-pretraining phase is plain state and rules; the trainer's parts do not import the trainer classes.
    assert graph["vcppo_trl.trainer.value_pretraining"] == set()
    parts = ("rollout.maker", "learner.ppo_learner", "trainer.saving", "trainer.resuming", "trainer.model_setup")
    for part in (*parts, "trainer.evaluation"):
        assert not graph[f"vcppo_trl.{part}"] & {"vcppo_trl.trainer.ppo", "vcppo_trl.trainer.vcppo"}, part


def test_pure_math_imports_only_torch():
    allowed = {"torch", "__future__", "collections", "dataclasses", "math", "typing", "contextlib", "time", "warnings"}
    found = {}
    for name in os.listdir(os.path.join(PACKAGE, "algo")):
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(open(os.path.join(PACKAGE, "algo", name)).read())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            if roots - allowed:
                found[name] = sorted(roots - allowed)
    assert found == {}


def test_a_name_imported_across_folders_is_in_that_folders_public_face():
    """Each folder's `__init__` lists its public API in `__all__`; another folder may import only those names."""
    import importlib

    outside = []
    for folder_path, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder_path, name)
            module = _module_name(path)
            package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
            source = folder_of(module)
            if source is None:  # the top level: the package's own faces, which re-export what users name
                continue
            for node in ast.walk(ast.parse(open(path).read())):
                if not isinstance(node, ast.ImportFrom) or not node.level:
                    continue
                base = package.split(".")
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                folder = folder_of(target) if target != "vcppo_trl" else None
                if folder is None or folder == source:
                    continue
                face = importlib.import_module(f"vcppo_trl.{folder}").__all__
                for alias in node.names:
                    if alias.name not in face and f"{target}.{alias.name}" != f"vcppo_trl.{folder}.{alias.name}":
                        outside.append(
                            f"{module} imports {alias.name} from {target}, not in vcppo_trl.{folder}.__all__"
                        )
    assert not outside, "\n".join(sorted(outside))


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
    """No module of the package over 500 lines (the configs' field lists excepted), and `PPOTrainer` is one class over
    TRL's base: its parts are objects it holds, not classes mixed into its bases."""
    import inspect

    from vcppo_trl import PPOTrainer

    long = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and os.path.basename(folder) != "config":
                lines = sum(1 for _ in open(path))
                if lines > 500:
                    long[os.path.relpath(path, PACKAGE)] = lines
    assert long == {}
    mixed_in = [c.__module__ for c in inspect.getmro(PPOTrainer)[1:] if c.__module__.startswith("vcppo_trl")]
    assert mixed_in == []


def _package_callables() -> dict[str, bool]:
    """Functions, methods and classes the package defines -> whether one of that name takes `*args`."""
    found: dict[str, bool] = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            for node in ast.walk(ast.parse(open(os.path.join(folder, name)).read())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    variadic = (
                        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.args.vararg is not None
                    )
                    found[node.name] = found.get(node.name, False) or variadic
    return found


def positional_calls(source: str, callables: dict[str, bool], limit: int = 3) -> list[str]:
    """Calls to the package's own callables that pass more than `limit` positional arguments or splat a tuple."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name not in callables or callables[name]:
            continue
        if len(node.args) > limit or any(isinstance(arg, ast.Starred) for arg in node.args):
            found.append(f"line {node.lineno}: {name}(...) with {len(node.args)} positional arguments")
    return found


def test_calls_past_three_arguments_use_keywords():
    """A reader should not count positions: the package's calls to its own functions pass at most three positional
    arguments and never splat a tuple into positions (functions that take `*args` aside)."""
    callables = _package_callables()
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found += [
                    f"{os.path.relpath(path, PACKAGE)} {c}" for c in positional_calls(open(path).read(), callables)
                ]
    assert not found, "\n".join(found)


def test_the_keyword_check_finds_positions_and_splats():
    callables = {"plan": False, "gather": True}
    source = "plan(a, b, c, d)\nplan(a, *rest)\nplan(a, b, c, d=d)\ngather(x, a, b, c, d)\nprint(a, b, c, d)\n"
    assert positional_calls(source, callables) == [
        "line 1: plan(...) with 4 positional arguments",
        "line 2: plan(...) with 2 positional arguments",
    ]


def rollout_source_types() -> tuple[set[str], set[str]]:
    """The classes of `rollout/` that are a rollout source (they define `next`) or a source's
    own report (they define `metrics(self, accelerator)`), protocols left out; and the modules that define a source."""
    classes, modules = set(), set()
    folder = os.path.join(PACKAGE, "rollout")
    for name in os.listdir(folder):
        if not name.endswith(".py"):
            continue
        for node in ast.parse(open(os.path.join(folder, name)).read()).body:
            if not isinstance(node, ast.ClassDef) or any(getattr(b, "id", None) == "Protocol" for b in node.bases):
                continue
            methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
            if "next" in methods:
                classes.add(node.name)
                modules.add(f"vcppo_trl.rollout.{name[:-3]}")
            elif "metrics" in methods:
                classes.add(node.name)
    return classes, modules


def test_the_trainer_and_checkpoints_import_no_rollout_source_type():
    """The trainer asks a `RolloutSource` for rollouts and logs what a source reports (`SourceReport`) without
    knowing which source it is: `trainer/` and `checkpoint/` import neither a source's class, nor its report's, nor a
    module that defines a source (the package's public face re-exports the protocol and the factory)."""
    classes, modules = rollout_source_types()
    # The finder sees every kind: whole responses, windows, overlap, stored rollouts, and the reports.
    assert {"WholeResponses", "WindowedRollouts", "OverlappedRollouts", "StoredRolloutSource"} <= classes
    assert {"WindowStep", "OverlapStats"} <= classes and "RolloutSource" not in classes
    graph = package_import_graph()
    found = []
    for module, targets in graph.items():
        if not module.startswith(("vcppo_trl.trainer", "vcppo_trl.checkpoint")):
            continue
        path = os.path.join(os.path.dirname(PACKAGE), *module.split(".")) + ".py"
        if not os.path.exists(path):
            path = path[: -len(".py")] + "/__init__.py"
        names = {
            alias.name
            for node in ast.walk(ast.parse(open(path).read()))
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        found += [f"{module} imports {name}" for name in sorted(names & classes)]
        found += [f"{module} imports {target}" for target in sorted(targets & modules)]
    assert not found, "\n".join(found)
