"""Two "nodes" on one host: two `accelerate launch --num_machines 2 --machine_rank {0,1}` launchers, one process each,
meeting at 127.0.0.1 (gloo). This is what examples/slurm/train.sbatch runs on each node of a real cluster, with the
node's own rank and the first node's address. Each rank runs worker.py (beside this file); both share one output
directory, as nodes sharing a filesystem do."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from ...paths import REPO, WORKER

CONFIGS = os.path.join(REPO, "configs", "accelerate")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_nodes(out_dir, config, worker_args=(), cpu_env=True):
    """Start one launcher per simulated node; returns the two Popen objects (node 0 first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRL_EXPERIMENTAL_SILENCE="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), env.get("PYTHONPATH", "")]),
    )
    if cpu_env:
        env["ACCELERATE_USE_CPU"] = "1"  # DDP over gloo; DeepSpeed on CPU takes --ddp_backend gloo instead
    port = _free_port()
    nodes = []
    for rank in (0, 1):
        cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file", config]
        cmd += ["--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank)]
        cmd += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--mixed_precision", "no"]
        cmd += [WORKER, str(out_dir), *worker_args]
        nodes.append(
            subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    return nodes


def _finish(nodes, timeout=300):
    outputs = []
    try:
        for node in nodes:
            outputs.append(node.communicate(timeout=timeout)[0])
    finally:
        for node in nodes:
            node.kill()
    return outputs


DDP = os.path.join(CONFIGS, "multi_node_ddp.yaml")
ZERO3 = os.path.join(CONFIGS, "multi_node_zero3.yaml")
SETTINGS = {
    "ddp": (DDP, {}, True),
    "zero3": (ZERO3, {"ddp_backend": "gloo"}, False),
}


@pytest.mark.parametrize("engine", ["ddp", "zero3"])
def test_two_nodes_train_agree_and_checkpoint_once(tmp_path, engine):
    config, settings, cpu_env = SETTINGS[engine]
    if engine == "zero3":
        pytest.importorskip("deepspeed")
    overrides = {**settings, "save_strategy": "steps", "save_steps": 1}
    outputs = _finish(_start_nodes(tmp_path, config, [json.dumps(overrides)], cpu_env))
    for node, output in zip((0, 1), outputs):
        assert (tmp_path / f"rank{node}.json").is_file(), output[-4000:]
    r0, r1 = (json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1))
    for rank, info in enumerate((r0, r1)):
        assert info["rank"] == rank
        assert info["num_processes"] == info["torch_world_size"] == 2  # one job of 2 ranks, not 2 jobs of 1
        assert info["global_step"] == 3 and info["batch_size"] == 16
    # Both ranks trained on their own prompts (no overlap) and end with the same weights.
    seen0 = {i for update in r0["seen"] for i in update}
    seen1 = {i for update in r1["seen"] for i in update}
    assert len(seen0) == len(seen1) == 24 and not seen0 & seen1
    assert r0["policy_hash"] != r0["initial_policy_hash"]
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])

    # One checkpoint per update, each complete (both ranks' RNG states in the one directory), nothing half-written.
    from vcppo_trl.checkpoint.files import missing_checkpoint_files

    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(("checkpoint", "tmp-"))) == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
    ]
    last = run / "checkpoint-3"
    assert missing_checkpoint_files(str(last), 2, deepspeed=engine == "zero3") == []
    assert sorted(p.name for p in last.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    # The saved policy is the trained one.
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, os.path.dirname(WORKER))
    try:
        from worker import state_hash
    finally:
        sys.path.pop(0)
    assert state_hash(AutoModelForCausalLM.from_pretrained(tmp_path / "model")) == r0["policy_hash"]


@pytest.mark.parametrize("engine", ["ddp", "zero3"])
def test_sigterm_to_one_node_stops_the_job_at_one_checkpoint(tmp_path, engine):
    """A scheduler preempting one node sends SIGTERM to its launcher only: the signal reaches that node's rank, the
    ranks agree after the running update, save one complete checkpoint together and stop, on both nodes."""
    config, settings, cpu_env = SETTINGS[engine]
    if engine == "zero3":
        pytest.importorskip("deepspeed")
    nodes = _start_nodes(tmp_path, config, [json.dumps({**settings, "total_episodes": 16000})], cpu_env)
    output = []
    try:
        for line in nodes[1].stdout:
            output.append(line)
            if line.startswith("UPDATE 2 "):
                break
        nodes[1].send_signal(signal.SIGTERM)
        outputs = _finish(nodes, timeout=180)
    finally:
        for node in nodes:
            node.kill()
    assert nodes[0].returncode != 0 and nodes[1].returncode != 0, "".join(output)[-3000:]
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert ranks[0] == ranks[1], outputs  # both stopped after the same update, naming the same checkpoint
    checkpoint = ranks[0]["interrupted"]
    assert checkpoint.endswith(f"checkpoint-{ranks[0]['global_step']}")
    assert ranks[0]["global_step"] < 1000  # stopped long before the end of the run
    from vcppo_trl.checkpoint.files import missing_checkpoint_files

    assert missing_checkpoint_files(checkpoint, 2, deepspeed=engine == "zero3") == []
    assert os.path.isfile(os.path.join(checkpoint, "rng_state_1.pth"))
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith("tmp-")]


SRUN = """#!/bin/bash
# Stand-in for SLURM's srun on one host: one task per "node", each with its SLURM_NODEID, all at once. Like srun with
# --kill-on-bad-exit=1 (which train.sbatch passes), the first task that fails ends the others: SIGTERM to their
# launchers (which pass it on to their ranks), SIGKILL 30 s later; a SIGTERM or SIGINT to srun itself does the same.
# Without this a node that died left the other waiting at the rendezvous or the launcher's exit barrier (up to 300 s)
# while srun waited for both.
while [[ "$1" == --* ]]; do shift; done
pids=()
stop() {
    kill -TERM "${pids[@]}" 2>/dev/null
    for ((i = 0; i < 30; i++)); do
        kill -0 "${pids[@]}" 2>/dev/null || return 0
        sleep 1
    done
    kill -KILL "${pids[@]}" 2>/dev/null
}
trap 'stop; exit 143' TERM INT
for ((node = 0; node < SLURM_NNODES; node++)); do SLURM_NODEID=$node "$@" & pids+=($!); done
status=0
for ((left = ${#pids[@]}; left > 0; left--)); do
    wait -n "${pids[@]}"
    code=$?
    if ((code != 0)); then
        echo "srun (stand-in): a task exited with status $code; terminating the other tasks (--kill-on-bad-exit)" >&2
        status=$code
        stop
        break
    fi
done
wait
exit $status
"""


def _run_script(script, env, timeout=300):
    """Run the batch script in its own process group; past `timeout`, stop the whole job (srun's tasks included, as
    scancel would) and fail with its output, rather than leave it running."""
    proc = subprocess.Popen(
        ["bash", script],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the script and the srun stand-in, which stops its tasks
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        pytest.fail(
            f"train.sbatch did not finish within {timeout} s; stopped. Output:\n{stdout[-3000:]}\n{stderr[-6000:]}"
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _slurm_stand_ins(tmp_path, out, job_id: str):
    """Stand-ins for `srun` and `scontrol` in `tmp_path/bin`, and the environment `train.sbatch` sees on 2 nodes of one
    CPU process each (DDP, the toy recipe, output in `out`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\necho 127.0.0.1\n")
    for tool in ("srun", "scontrol"):
        os.chmod(bin_dir / tool, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(
        PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), env.get("PYTHONPATH", "")]),
        ACCELERATE_USE_CPU="1",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRL_EXPERIMENTAL_SILENCE="1",
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_NNODES="2",
        SLURM_JOB_ID=job_id,
        SLURM_JOB_NAME="vcppo",
        GPUS_PER_NODE="1",
        MAIN_PROCESS_PORT=str(_free_port()),
        ENGINE="ddp",
        RECIPE="configs/recipes/tiny_cpu.yaml",
        OUTPUT_DIR=str(out),
        LAUNCH_ARGS="--mixed_precision no",
    )
    return bin_dir, env


def test_slurm_script_with_stand_in_srun(tmp_path):
    """examples/slurm/train.sbatch on 2 simulated nodes (stand-ins for srun and scontrol, CPU): the toy trains and
    checkpoints once per save; run again (a requeued job), it finds the checkpoint and resumes from it."""
    out = tmp_path / "run"
    bin_dir, env = _slurm_stand_ins(tmp_path, out, job_id="4242")
    toy = "--toy_num_train 256 --toy_num_eval 8 --toy_max_digits 2 --toy_cold_start_steps 2 --value_pretrain_steps 1"
    toy += " --response_length 24 --num_ppo_epochs 1 --save_strategy steps --save_steps 1"
    script = os.path.join(REPO, "examples", "slurm", "train.sbatch")
    # 1 value-pretraining + 2 PPO updates of 64 prompts (2 ranks × 8 × 2 × 2).
    first = _run_script(script, {**env, "TRAIN_ARGS": toy + " --total_episodes 128"})
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-5000:]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", "tmp-"))) == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
    ]
    from vcppo_trl.checkpoint.files import missing_checkpoint_files, read_training_state

    assert missing_checkpoint_files(str(out / "checkpoint-3"), 2) == []
    assert read_training_state(str(out / "checkpoint-3"))["num_processes"] == 2  # one job of 2 ranks
    # Requeued with a larger budget: the script passes --resume_from_checkpoint true and the run continues.
    second = _run_script(
        script, {**env, "TRAIN_ARGS": toy + " --total_episodes 192", "MAIN_PROCESS_PORT": str(_free_port())}
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-5000:]
    assert "Resumed from" in second.stdout + second.stderr
    assert (out / "checkpoint-4").is_dir() and read_training_state(str(out / "checkpoint-4"))["global_step"] == 4


def test_slurm_script_fails_fast_when_a_node_dies(tmp_path):
    """A node whose launcher dies before the rendezvous (here node 1, at once) ends the job with its exit status,
    quickly, as `srun --kill-on-bad-exit=1` does; the other node does not wait out the rendezvous timeout (600 s)."""
    import time

    bin_dir, env = _slurm_stand_ins(tmp_path, tmp_path / "run", job_id="4243")
    env["TRAIN_ARGS"] = "--toy_num_train 64 --total_episodes 64"
    real = os.path.join(os.path.dirname(sys.executable), "accelerate")
    (bin_dir / "accelerate").write_text(
        '#!/bin/bash\nif [[ "$SLURM_NODEID" == 1 ]]; then echo "node 1: simulated crash" >&2; exit 3; fi\n'
        f'exec "{real}" "$@"\n'
    )
    os.chmod(bin_dir / "accelerate", 0o755)
    start = time.monotonic()
    proc = _run_script(os.path.join(REPO, "examples", "slurm", "train.sbatch"), env, timeout=150)
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "node 1: simulated crash" in proc.stderr
    assert "a task exited with status 3; terminating the other tasks" in proc.stderr
    assert elapsed < 120, f"took {elapsed:.0f} s"
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("checkpoint-*"))
