"""The README's quickstart block run as written on SmolLM2-135M-Instruct, with only the model id replaced by the folder
`scripts/fetch_smollm2.py` writes (issue 62: "the whole block run outside CI once, its time in the docs").

    python experiments/real_model/quickstart_smollm2.py   # 13 min on a 2-core CPU; run it with nothing else running

Writes `experiments/results/real_model/quickstart/`: `run.json` (wall time of the block, machine, commit), the
trainer's `log_history.json` (value pretraining's and PPO's logged metrics) and the console output `console.log`
(without the progress bar's redraws).
The block runs in a fresh interpreter in a scratch folder, as a user would paste it; two lines after it save the log
history.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

from smollm2 import commit, smollm2_folder  # this folder's: the scripts run from it

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "experiments", "results", "real_model", "quickstart")
QUICKSTART_MODEL = '"HuggingFaceTB/SmolLM2-135M-Instruct"'
SAVE_LOGS = '\nimport json\njson.dump(trainer.state.log_history, open("log_history.json", "w"), indent=1)\n'


def readme_quickstart() -> str:
    """The README's quickstart block, the first ```python block under its "## Quickstart"."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    return re.search(r"```python\n(.*?)```", readme[readme.index("## Quickstart") :], re.S).group(1)


def drop_progress_redraws(path: str) -> None:
    """Keeps the console's lines, not the progress bar's redraws (`\\r`-separated frames with `%|`)."""
    with open(path) as f:
        lines = f.read().replace("\r", "\n").splitlines()
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines if line.strip() and "%|" not in line))


def main() -> None:
    folder = smollm2_folder()
    code = readme_quickstart()  # as CI reads it (tests/integration/scripts/test_defaults.py)
    if code.count(QUICKSTART_MODEL) != 1:
        raise SystemExit(f"README's quickstart no longer names {QUICKSTART_MODEL} once")
    code = code.replace(QUICKSTART_MODEL, repr(folder)) + SAVE_LOGS
    os.makedirs(OUT, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    with tempfile.TemporaryDirectory() as scratch, open(os.path.join(OUT, "console.log"), "w") as console:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env, stdout=console, stderr=console)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            raise SystemExit(f"the block failed (exit {result.returncode}): see {OUT}/console.log")
        os.replace(os.path.join(scratch, "log_history.json"), os.path.join(OUT, "log_history.json"))
    drop_progress_redraws(os.path.join(OUT, "console.log"))
    run = {
        "block_seconds": round(seconds, 1),
        "commit": commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "python": platform.python_version(),
        "model_folder": folder,
    }
    with open(os.path.join(OUT, "run.json"), "w") as f:
        json.dump(run, f, indent=1)
    print(json.dumps(run, indent=1))


if __name__ == "__main__":
    main()
