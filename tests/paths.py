"""Paths the tests share, the same from any folder under tests/."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
DISTRIBUTED = os.path.join(TESTS, "integration", "distributed")
# One rank of a multi-process training run (benchmarks/gpu_check.py runs it too).
WORKER = os.path.join(DISTRIBUTED, "worker.py")
# One rank of the 2-process check of the loss aggregation.
GRAD_WORKER = os.path.join(DISTRIBUTED, "grad_worker.py")
# One rank of the 2-process check of balanced ranks.
BALANCE_WORKER = os.path.join(DISTRIBUTED, "balance_worker.py")
# One rank of the 2-process FSDP2 run with low-memory loading from a directory.
LOADING_WORKER = os.path.join(DISTRIBUTED, "loading_worker.py")
# One rank of the 2-process check of the rollout's split forwards (sequence parallelism).
SP_ROLLOUT_WORKER = os.path.join(DISTRIBUTED, "sp_rollout_worker.py")
TOOLS_WORKER = os.path.join(DISTRIBUTED, "tools_worker.py")
# One rank of the 2-process DDP run of tool episodes in each rank's rollout worker (`max_staleness`).
TOOL_OVERLAP_WORKER = os.path.join(DISTRIBUTED, "tool_overlap_worker.py")
# One rank of the 2-process run with a `rollout_func` (DDP, ZeRO-3, FSDP2).
ROLLOUT_FUNC_WORKER = os.path.join(DISTRIBUTED, "rollout_func_worker.py")
# A group advantage estimator's advantages on 2 processes, against group_advantages of both ranks' scores.
ADVANTAGE_WORKER = os.path.join(DISTRIBUTED, "advantage_worker.py")
