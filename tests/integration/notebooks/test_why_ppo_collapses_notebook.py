"""The mechanism notebook runs top to bottom in its fast mode (a tiny reproduction) and shows its plots inline."""

import os

import nbformat
from nbclient import NotebookClient

from ...paths import REPO

NOTEBOOK = os.path.join(REPO, "notebooks", "why_ppo_collapses.ipynb")


def test_why_ppo_collapses_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.setenv("VCPPO_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("VCPPO_REPO", REPO)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(images) >= 7  # the λ-decay plot, the first toy's four figures and the majority task's two, inline
    text = "".join(out.get("text", "") for out in outputs)
    assert "Tiny smoke run" in text and "held-out accuracy" in text
    assert "Tiny smoke run of the majority task" in text and "0.925" in text  # the note's λ 0.95, k = 10 case
