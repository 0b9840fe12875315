"""The vLLM server as a rollout worker (`sampling/server_worker.py`) and the weight transfers
(`sampling/weight_transfer.py`), against fakes of the server: the order of generations and pushes, the versions,
failures, and what the shared folder writes. The real CPU server runs them in tests/integration/test_vllm.py."""

from __future__ import annotations

import os
import threading
import types

import pytest
import torch

from vcppo_trl.sampling.seam import SamplerError
from vcppo_trl.sampling.server_worker import ServerWorker
from vcppo_trl.sampling.weight_transfer import SharedFolderTransfer, choose_transfer

pytestmark = pytest.mark.fast


class FakeTransfer:
    """Stages the weights' first value; `send` makes the fake server sample with it."""

    copies = True

    def __init__(self, server):
        self.server = server
        self.fail = False

    def stage(self, weights):
        return float(dict(weights)["w"])

    def send(self, staged):
        if self.fail:
            raise RuntimeError("the server could not read the folder")
        self.server.weights = staged


class FakeSampler:
    """What `ServerWorker` uses of a `VLLMServerSampler`; its server answers each prompt with the weight it holds
    (as a token id) after the prompt's first token, so a sample shows which push sampled it."""

    def __init__(self, delay: threading.Event | None = None):
        self.accelerator = types.SimpleNamespace(
            is_main_process=True, num_processes=1, process_index=0, device=torch.device("cpu")
        )
        self.device = torch.device("cpu")
        self.stop_token_ids = [99]
        self.tokenizer = types.SimpleNamespace(pad_token_id=0)
        self.timeout = 5.0
        self.base_url = "http://fake"
        self.sync_description = "Pushing the policy's weights to the fake server"
        self.queue = None
        self.weights = None
        self.transfer = FakeTransfer(self)
        self.delay = delay

    def completions(self, prompts, config):
        if self.delay is not None:
            self.delay.wait(timeout=5)
        token = int(self.weights)
        return [[p[0], token] for p in prompts], [[-0.5, -0.25] for _ in prompts]


def _ids(*rows):
    return torch.tensor(rows), torch.ones(len(rows), len(rows[0]), dtype=torch.long)


def test_each_generation_samples_from_the_weights_pushed_before_it_was_submitted():
    gate = threading.Event()  # the server is slow: the trainer queues everything before the first answer
    sampler = FakeSampler(delay=gate)
    worker = ServerWorker(sampler, iter([("w", torch.tensor(1.0))]))
    assert sampler.queue is worker
    first = worker.submit(*_ids([5, 6]), config={}, seed=0)
    worker.push_weights(iter([("w", torch.tensor(2.0))]))
    second = worker.submit(*_ids([7, 8], [9, 9]), config={}, seed=1)
    worker.push_weights(iter([("w", torch.tensor(3.0))]))
    gate.set()
    a, b = worker.result(first), worker.result(second)
    assert (a.version, b.version) == (0, 1) and worker.version == 2
    assert a.samples.response_ids.tolist() == [[5, 1]]  # the weights of version 0
    assert b.samples.response_ids.tolist() == [[7, 2], [9, 2]]
    assert b.samples.logprobs.tolist() == [[-0.5, -0.25], [-0.5, -0.25]]
    # The trainer's own requests (evaluation) go through the queue, after the push before them.
    assert worker.sample_now([[4]], {})[0] == [[4, 3]]
    with pytest.raises(RuntimeError, match="already taken"):
        worker.result(first)
    assert worker.state() == {"submitted": 3, "version": 2}
    worker.close()
    assert not worker.thread.is_alive() and sampler.queue is None


def test_a_failed_push_fails_every_later_generation_and_never_samples_stale():
    sampler = FakeSampler()
    worker = ServerWorker(sampler, iter([("w", torch.tensor(1.0))]))
    before = worker.submit(*_ids([5, 6]), config={}, seed=0)
    assert worker.result(before).samples.response_ids.tolist() == [[5, 1]]
    sampler.transfer.fail = True
    worker.push_weights(iter([("w", torch.tensor(2.0))]))
    after = worker.submit(*_ids([5, 6]), config={}, seed=1)
    with pytest.raises(SamplerError, match="fake server failed .*could not read the folder.*stale weights"):
        worker.result(after)
    worker.close()


def test_a_failing_request_is_a_sampler_error_naming_the_server():
    sampler = FakeSampler()
    sampler.completions = lambda prompts, config: (_ for _ in ()).throw(ConnectionError("refused"))
    worker = ServerWorker(sampler, iter([("w", torch.tensor(1.0))]))
    request = worker.submit(*_ids([5, 6]), config={}, seed=0)
    with pytest.raises(SamplerError, match=r"server at http://fake failed to generate \(ConnectionError: refused"):
        worker.result(request)
    worker.close()


def test_auto_transfer_is_nccl_on_cuda_and_the_folder_elsewhere():
    assert choose_transfer("auto", torch.device("cpu")) == "shared_folder"
    assert choose_transfer("auto", torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ValueError, match="NCCL, which needs CUDA.*'shared_folder'"):
        choose_transfer("nccl", torch.device("cpu"))


class FakeResponse:
    def __init__(self, status_code, text=""):
        self.status_code, self.text = status_code, text


class FakeClient:
    """TRL's `VLLMClient` as the shared folder uses it: its session's GET and POST, and `reset_prefix_cache`."""

    base_url = "http://fake"

    def __init__(self, has_rpc=True):
        self.posts, self.resets = [], 0
        self.session = types.SimpleNamespace(
            get=lambda url: FakeResponse(405 if has_rpc else 404),
            post=lambda url, json=None: self.posts.append((url, json)) or FakeResponse(200),
        )

    def reset_prefix_cache(self):
        self.resets += 1


def test_the_shared_folder_writes_each_push_and_keeps_only_the_newest(tmp_path):
    from safetensors.torch import load_file

    (tmp_path / "weights-7").mkdir()  # an earlier run's: removed at the start
    client = FakeClient()
    transfer = SharedFolderTransfer(client, str(tmp_path))
    embedding = torch.arange(6.0).reshape(3, 2)
    tied = [("model.embed_tokens.weight", embedding), ("lm_head.weight", embedding)]  # one tensor, two names
    transfer.push(lambda: iter(tied))
    path = str(tmp_path / "weights-0")
    assert client.posts == [
        ("http://fake/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})
    ]
    assert client.resets == 1
    saved = load_file(os.path.join(path, "model.safetensors"))
    assert torch.equal(saved["lm_head.weight"], embedding) and torch.equal(
        saved["model.embed_tokens.weight"], embedding
    )
    staged = transfer.stage(iter([("model.embed_tokens.weight", embedding + 1)]))
    assert sorted(os.listdir(tmp_path)) == ["weights-0", "weights-1"]  # staged, not sent: the server reads weights-0
    transfer.send(staged)
    assert sorted(os.listdir(tmp_path)) == ["weights-1"]


def test_the_shared_folder_needs_the_servers_rpc_route_and_other_processes_write_nothing(tmp_path):
    with pytest.raises(ValueError, match="no /collective_rpc route.*VLLM_SERVER_DEV_MODE=1"):
        SharedFolderTransfer(FakeClient(has_rpc=False), str(tmp_path / "a"))
    other = SharedFolderTransfer(None, str(tmp_path / "b"))  # a process that is not the main one
    gathered = []
    other.push(lambda: (gathered.append(n) or (n, torch.ones(1)) for n in ("x", "y")))
    assert gathered == ["x", "y"] and not (tmp_path / "b").exists()


class _Stalled:
    """A results queue whose reader blocks for good after the messages given: the state a worker killed while it
    writes an answer leaves behind (the rest of the message never comes, and the trainer holds the pipe's write end)."""

    def __init__(self, *messages):
        self.messages = list(messages)

    def get(self, timeout=None):
        if self.messages:
            return self.messages.pop(0)
        threading.Event().wait()


def _dead_worker(results):
    from vcppo_trl.sampling.worker import RolloutWorker

    worker = object.__new__(RolloutWorker)
    worker.name, worker.results, worker.device = "hf-worker", results, torch.device("cpu")
    worker.process = types.SimpleNamespace(is_alive=lambda: False, exitcode=-9)
    worker.submitted, worker.ready, worker.taken = 2, {}, set()
    worker._start_reader()
    return worker


def test_a_process_worker_killed_mid_answer_is_a_sampler_error_not_a_hang():
    import time

    worker = _dead_worker(_Stalled())
    start = time.perf_counter()
    with pytest.raises(SamplerError, match=r"died \(exit code -9\) while the trainer waited for generation 0"):
        worker.result(0)
    assert time.perf_counter() - start < 10


def test_an_answer_written_whole_before_the_worker_died_is_still_taken():
    ids, mask = torch.tensor([[3, 4]]), torch.tensor([[True, True]])
    answer = (ids, mask, torch.tensor([False]), torch.tensor([[-0.1, -0.2]]))
    worker = _dead_worker(_Stalled(("samples", 0, answer, 1, 0.5, 0.0)))
    generated = worker.result(0)
    assert generated.version == 1 and generated.samples.response_ids.tolist() == [[3, 4]]
    with pytest.raises(SamplerError, match="waited for generation 1"):
        worker.result(1)
