"""Every relative link in the README and docs/ resolves: the file exists and, for `#anchor`, the heading does."""

from __future__ import annotations

import glob
import os
import re

import pytest

from ..paths import REPO as ROOT

PAGES = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens kept), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    text = re.sub(r"```.*?```", "", open(path).read(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def links(path: str) -> list[str]:
    text = re.sub(r"```.*?```", "", open(path).read(), flags=re.S)  # code blocks hold no links
    return [target for target in LINK.findall(text) if not target.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("page", PAGES, ids=[os.path.relpath(p, ROOT) for p in PAGES])
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(file):
            broken.append(f"{target} (no such file)")
        elif anchor and file.endswith(".md") and anchor not in anchors(file):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{os.path.relpath(page, ROOT)}: {broken}"


def test_slug_matches_github():
    assert slug("On-policy updates (the shortcut GRPO takes)") == "on-policy-updates-the-shortcut-grpo-takes"
    assert slug("Speed (`benchmarks/rollout.py`)") == "speed-benchmarksrolloutpy"
    assert slug("Does it work?") == "does-it-work"


def test_readme_is_a_landing_page():
    assert sum(1 for _ in open(PAGES[0])) <= 200


REPO_PATH = re.compile(
    r"(?<![\w/.$-])((?:configs|benchmarks|experiments|scripts|notebooks|tests|src|docs|examples)/[\w./-]+"
    r"\.(?:py|yaml|yml|sh|ipynb|md|toml)|train\.py)\b"
)


def command_block_paths(path: str) -> list[str]:
    """Repository files named in the page's fenced code blocks (commands and configs a reader will run)."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", open(path).read(), flags=re.S)
    return [m for block in blocks for m in REPO_PATH.findall(block)]


@pytest.mark.parametrize("page", PAGES, ids=[os.path.relpath(p, ROOT) for p in PAGES])
def test_files_named_in_command_blocks_exist(page):
    missing = sorted({p for p in command_block_paths(page) if not os.path.exists(os.path.join(ROOT, p))})
    assert not missing, f"{os.path.relpath(page, ROOT)} names files that are not in the repository: {missing}"


def test_command_block_paths_finds_repository_files(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\naccelerate launch --config_file configs/accelerate/zero3.yaml train.py \\\n"
        "  --config configs/recipes/nope.yaml --output_dir /runs/x/out.yaml\n```\n"
    )
    assert command_block_paths(str(page)) == ["configs/accelerate/zero3.yaml", "train.py", "configs/recipes/nope.yaml"]


PACKAGE_DIR = os.path.join(ROOT, "src", "vcppo_trl")
SOURCE_PATH = re.compile(r"`((?:src/vcppo_trl/)?[a-z_]+/[a-z_]+\.py|[a-z_]+\.py)`")
STAGE_ROW = re.compile(r"^\| `?([a-z_]+/|top level)`? \|(.*)$", re.M)


def package_paths_named(path: str) -> list[str]:
    """Package paths a page names, relative to the repository: `src/vcppo_trl/...` and `<folder>/<module>.py` for a
    folder of the package anywhere; on a row of a stage map (`| trainer/ | ...`), bare module names of that folder."""
    text = open(path).read()
    folders = {name for name in os.listdir(PACKAGE_DIR) if os.path.isdir(os.path.join(PACKAGE_DIR, name))}
    named = set()
    for match in SOURCE_PATH.finditer(text):
        found = match.group(1)
        if found.startswith("src/"):
            named.add(found)
        elif "/" in found and found.split("/")[0] in folders:
            named.add(f"src/vcppo_trl/{found}")
    for folder, row in STAGE_ROW.findall(text):
        base = "src/vcppo_trl/" + ("" if folder == "top level" else folder)
        named |= {f"{base}{name}" for name in re.findall(r"`([a-z_]+\.py)`", row)}
    return sorted(named)


@pytest.mark.parametrize("page", PAGES, ids=[os.path.relpath(p, ROOT) for p in PAGES])
def test_package_paths_a_page_names_exist(page):
    """Module paths in the docs (the architecture page's stage map above all) name files that exist."""
    missing = [named for named in package_paths_named(page) if not os.path.exists(os.path.join(ROOT, named))]
    assert not missing, missing


def test_the_architecture_page_maps_every_folder_and_the_check_finds_a_missing_path(tmp_path):
    page = os.path.join(ROOT, "docs", "architecture.md")
    rows = {folder for folder, _ in STAGE_ROW.findall(open(page).read())}
    folders = {name + "/" for name in os.listdir(PACKAGE_DIR) if os.path.isdir(os.path.join(PACKAGE_DIR, name))}
    assert rows == folders - {"__pycache__/"} | {"top level"}
    fake = tmp_path / "page.md"
    fake.write_text("see `trainer/no_such_module.py` and `rollout/maker.py`\n| `algo/` | `gae.py`, `nope.py` |\n")
    missing = [n for n in package_paths_named(str(fake)) if not os.path.exists(os.path.join(ROOT, n))]
    assert missing == ["src/vcppo_trl/algo/nope.py", "src/vcppo_trl/trainer/no_such_module.py"]
