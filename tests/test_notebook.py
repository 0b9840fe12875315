"""The quickstart notebook runs top to bottom (small settings) and produces its figure."""

import os

import nbformat
from nbclient import NotebookClient

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks", "quickstart.ipynb")


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
