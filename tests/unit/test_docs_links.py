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
