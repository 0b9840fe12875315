"""The quickstart notebook runs top to bottom (small settings) and produces its figure."""

import os

import nbformat
from nbclient import NotebookClient

from ...paths import REPO

NOTEBOOK = os.path.join(REPO, "notebooks", "quickstart.ipynb")


def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.setenv("VCPPO_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("VCPPO_NOTEBOOK_OUTPUT", str(tmp_path / "out"))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    assert (tmp_path / "out" / "quickstart.png").exists()
    outputs = "".join(
        out.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
    assert "held-out accuracy:" in outputs
    # The fast mode says plainly that it does not learn.
    assert "smoke run, too short to learn anything" in outputs
    # The figure is shown inline (an image output), not only saved.
    images = [
        out
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == 1
    # The text describes the model the code builds, and the log is compact lines, not metric dicts.
    intro = notebook.cells[0].source
    assert "Llama" in intro and "Qwen2 policy" not in intro
    assert "update 1/" in outputs and "{'objective/scores'" not in outputs
