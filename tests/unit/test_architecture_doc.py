"""docs/architecture.md and the files agree: every path it names exists, and every module of the package is named (a
contributor follows its file table and "where to add X" to the code)."""

from __future__ import annotations

import os
import re

from ..paths import REPO

DOC = os.path.join(REPO, "docs", "architecture.md")
PACKAGE = os.path.join(REPO, "src", "vcppo_trl")
# A code-formatted path: folders and a file with an extension, or a folder ending in "/".
PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*(?:\.(?:py|md|yaml|json|sh|ipynb)|/))`")


def named_paths(text: str) -> list[str]:
    return [m.group(1) for m in PATH.finditer(text) if not m.group(1).startswith((".", "/"))]


def file_names_in(root: str) -> set[str]:
    return {name for _, _, files in os.walk(root) for name in files}


def exists(path: str, names: set[str]) -> bool:
    """A path with a folder: under the package or the repository; a bare file name: some file of that name."""
    if "/" not in path.rstrip("/"):
        return path.rstrip("/") in names or os.path.isdir(os.path.join(PACKAGE, path))
    return any(os.path.exists(os.path.join(root, path)) for root in (PACKAGE, REPO))


def test_every_path_the_architecture_page_names_exists():
    text = open(DOC).read()
    names = file_names_in(PACKAGE) | file_names_in(REPO)
    paths = named_paths(text)
    assert len(paths) > 50  # the page names the package's files
    missing = sorted({p for p in paths if not exists(p, names)})
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_the_path_check_finds_a_missing_file():
    names = {"ppo.py"}
    assert named_paths("the loop (`trainer/ppo.py`), `rollout/` and `x.y` and `maker`") == [
        "trainer/ppo.py",
        "rollout/",
    ]
    assert exists("trainer/ppo.py", names) and exists("rollout/", names) and exists("ppo.py", names)
    assert not exists("rollout/nowhere.py", names) and not exists("nowhere.py", names)


def test_every_module_of_the_package_is_named_on_the_architecture_page():
    named = set(named_paths(open(DOC).read()))
    unnamed = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py") and name != "__init__.py":
                relative = os.path.relpath(os.path.join(folder, name), PACKAGE).replace(os.sep, "/")
                if relative not in named and name not in named:
                    unnamed.append(relative)
    assert not unnamed, f"docs/architecture.md's file table does not name: {sorted(unnamed)}"
