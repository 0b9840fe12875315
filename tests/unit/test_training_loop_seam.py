"""`trainer/loop.py` is a seam, not a method moved out: every `trainer.<name>` it reads is declared in its
`LoopTrainer` protocol, and the trainers have every member the protocol declares."""

from __future__ import annotations

import ast
import os

from vcppo_trl.trainer.loop import LoopTrainer

from ..paths import REPO

LOOP = os.path.join(REPO, "src", "vcppo_trl", "trainer", "loop.py")


def names_read_of_trainer() -> set[str]:
    tree = ast.parse(open(LOOP).read())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer"
    }


def test_the_loop_reads_only_what_its_protocol_declares():
    declared = set(LoopTrainer.__annotations__)
    read = names_read_of_trainer()
    assert read, "the check found no trainer attribute: it parses the wrong file"
    assert read <= declared, f"trainer/loop.py reads undeclared trainer members: {sorted(read - declared)}"
    assert declared <= read, f"LoopTrainer declares members the loop never reads: {sorted(declared - read)}"


def test_a_trainer_has_every_member_the_loop_declares(fresh_trainer):
    trainer = fresh_trainer()
    set_by_the_run = {"prompts", "rollouts", "latest_metrics", "last_update", "_update_start"}
    missing = {name for name in set(LoopTrainer.__annotations__) - set_by_the_run if not hasattr(trainer, name)}
    assert not missing, f"{type(trainer).__name__} lacks {sorted(missing)}"
    trainer.train()  # and after a run, what the run sets too
    assert all(hasattr(trainer, name) for name in set_by_the_run)
