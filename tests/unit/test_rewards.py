"""Tests for `vcppo_trl.rewards` (math-verify verifier reward and reward registry)."""

import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from vcppo_trl.rewards import math_verify as rewards
from vcppo_trl.rewards.math_verify import (
    gold_candidates,
    make_math_verify_reward,
    math_verify_reward,
    shutdown_verifier_worker,
    split_think,
)
from vcppo_trl.rewards.registry import BUILTIN_REWARDS, resolve_reward_funcs


@pytest.fixture(scope="module", autouse=True)
def _stop_worker():
    yield
    shutdown_verifier_worker()


def _slow_score(answer, solution, timeout):
    """Stands in for `rewards._score_sample` in the worker process (imported there by reference)."""
    time.sleep(60)
    return 1.0, "slow"


# (completion, gold solution, expected reward)
CASES = [
    # boxed integers
    (r"<think>11 * 12 = 132</think> The answer is $\boxed{132}$.", "132", 1.0),
    (r"<think>11 * 12 = 131</think> The answer is $\boxed{131}$.", "132", -1.0),
    (r"\boxed{132}", 132, 1.0),  # non-string gold
    # fractions
    (r"<think>half</think> \boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"<think>half</think> \boxed{\frac{2}{4}}", r"\frac{1}{2}", 1.0),
    (r"<think>half</think> The final answer is 0.5", r"\frac{1}{2}", 1.0),
    (r"<think>half</think> \boxed{\frac{1}{3}}", r"\frac{1}{2}", -1.0),
    # boxed answer preferred over earlier LaTeX
    (r"<think>...</think> Since $x = 3$, the answer is \boxed{7}.", "7", 1.0),
    # answer only inside the reasoning block
    (r"<think>so it is \boxed{132}</think> I am done.", "132", -1.0),
    # reasoning block opened but never closed (e.g. truncated)
    (r"<think>so it is \boxed{132}", "132", -1.0),
    (r"<think>a</think> wait <think> it is \boxed{132}", "132", -1.0),
    # missing answer
    ("<think>hmm</think> I do not know.", "132", -1.0),
    ("", "132", -1.0),
    # only a closing tag (the template opened <think> in the prompt)
    (r"11 * 12 = 132</think> \boxed{132}", "132", 1.0),
    (r"it is \boxed{132}</think> done", "132", -1.0),
    # no tags at all: judged on the full text
    (r"The answer is \boxed{132}.", "132", 1.0),
    # bare LaTeX gold solutions
    (r"\boxed{\sqrt{2}}", r"\sqrt{2}", 1.0),
    (r"\boxed{3\sqrt{2}}", r"3\sqrt{2}", 1.0),
    (r"\boxed{3}", r"3\sqrt{2}", -1.0),  # parsed raw, the gold would be "3"
    (r"\boxed{[1, 3)}", "[1, 3)", 1.0),
    (r"\boxed{3}", "[1, 3)", -1.0),
    (r"\boxed{2\pi}", r"2\pi", 1.0),
    (r"\boxed{\frac{3}{4}}", r"\dfrac{3}{4}", 1.0),
    # gold solutions with their own delimiters
    (r"\boxed{\frac{1}{2}}", r"$\frac{1}{2}$", 1.0),
    (r"\boxed{132}", r"Multiply: $11 \cdot 12 = 132$, so the answer is $\boxed{132}$.", 1.0),
]


def _split_cases():
    completions = [case[0] for case in CASES]
    solutions = [case[1] for case in CASES]
    expected = [case[2] for case in CASES]
    return completions, solutions, expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>r</think> a", (" a", True)),
        ("r</think> a", (" a", True)),
        ("<think>r</think>x</think> a", (" a", True)),
        ("<think>r", (None, False)),
        ("<think>r</think> a <think> b", (None, False)),
        ("a", ("a", False)),
    ],
)
def test_split_think(text, expected):
    assert split_think(text) == expected


def test_split_think_custom_and_disabled_tags():
    assert split_think("[R]x[/R] a", ("[R]", "[/R]")) == (" a", True)
    assert split_think("<think>r", None) == ("<think>r", False)


def test_gold_candidates():
    assert gold_candidates(r" \sqrt{2} ") == [r"$\sqrt{2}$", r"\boxed{\sqrt{2}}", r"\sqrt{2}"]
    assert gold_candidates(r"$\sqrt{2}$")[0] == r"$\sqrt{2}$"
    assert gold_candidates("  ") == []


def test_rewards_main_thread():
    completions, solutions, expected = _split_cases()
    assert math_verify_reward(completions, solutions) == expected


def test_conversational_completions():
    completions = [
        [{"role": "assistant", "content": r"<think>r</think> \boxed{132}"}],
        [{"role": "assistant", "content": r"<think>r</think> \boxed{131}"}],
        [{"role": "assistant", "content": [{"type": "text", "text": r"<think>r</think> \boxed{132}"}]}],
        [{"role": "assistant", "content": None}],
        [],
    ]
    assert math_verify_reward(completions, ["132"] * 5) == [1.0, -1.0, 1.0, -1.0, -1.0]


@pytest.mark.parametrize("gold", ["", "   ", "$$", r"\boxed{}", None])
def test_unparseable_gold_gives_none(gold):
    assert math_verify_reward([r"\boxed{1}"], [gold]) == [None]


def test_log_extra_and_trainer_kwargs():
    logged = {}
    result = math_verify_reward(
        [r"</think> \boxed{132}", "<think>no end"],
        ["132", "132"],
        log_extra=lambda key, values: logged.__setitem__(key, values),
        log_metric=lambda name, value: None,
        trainer_state=None,
        prompts=["p", "p"],
    )
    assert result == [1.0, -1.0]
    assert logged == {"math_verify_reward/answer": ["132", "[unclosed reasoning]"]}


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        math_verify_reward([r"\boxed{1}", r"\boxed{2}"], ["1"])


def test_non_main_thread_matches_main_thread():
    completions, solutions, expected = _split_cases()
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(math_verify_reward, completions, solutions).result(timeout=120) == expected

    results = []
    thread = threading.Thread(target=lambda: results.append(math_verify_reward(completions[:4], solutions[:4])))
    thread.start()
    thread.join(timeout=120)
    assert results == [expected[:4]]


def test_timeout_off_main_thread_kills_worker_and_recovers(monkeypatch):
    reward = make_math_verify_reward(timeout_seconds=0.5)
    completions, solutions = [r"</think> \boxed{132}"], ["132"]
    with ThreadPoolExecutor(max_workers=1) as pool:
        # Warm up the worker so that its start-up time is not measured.
        assert pool.submit(reward, completions, solutions).result(timeout=120) == [1.0]

        with monkeypatch.context() as patch:
            patch.setattr(rewards, "_score_sample", _slow_score)
            logged = {}
            start = time.monotonic()
            result = pool.submit(
                reward, completions, solutions, log_extra=lambda key, values: logged.__setitem__(key, values)
            ).result(timeout=120)
            elapsed = time.monotonic() - start
        assert result == [-1.0]
        assert logged == {"math_verify_reward/answer": ["[timeout]"]}  # the timeout path, not an error path
        assert elapsed < 10

        # The killed worker is replaced on the next call.
        assert pool.submit(reward, completions + [r"\boxed{1}"], solutions + ["2"]).result(timeout=120) == [1.0, -1.0]


def test_default_timeout_is_read_at_call_time(monkeypatch):
    seen = []

    def fake_verify_answer(answer, solution, timeout=None):
        seen.append(timeout)
        return 1.0, "x"

    monkeypatch.setattr(rewards, "verify_answer", fake_verify_answer)
    monkeypatch.setattr(rewards, "DEFAULT_TIMEOUT_SECONDS", 2.5)
    math_verify_reward(["a"], ["1"])
    make_math_verify_reward(timeout_seconds=0.1)(["a"], ["1"])
    assert seen == [3, 1]  # rounded up to whole seconds for signal.alarm


def test_factory():
    reward = make_math_verify_reward(timeout_seconds=1.0, think_tags=("<reasoning>", "</reasoning>"))
    assert reward.__name__ == "math_verify_reward"
    assert math_verify_reward.__name__ == "math_verify_reward"
    assert make_math_verify_reward(name="correctness").__name__ == "correctness"
    assert reward([r"<reasoning>r</reasoning> \boxed{2}", r"<reasoning>\boxed{2}"], ["2", "2"]) == [1.0, -1.0]
    assert make_math_verify_reward(think_tags=None)([r"<think>\boxed{2}"], ["2"]) == [1.0]
    with pytest.raises(ValueError):
        make_math_verify_reward(timeout_seconds=0)
    with pytest.raises(ValueError):
        make_math_verify_reward(think_tags=("<think>",))


def test_reward_is_picklable():
    restored = pickle.loads(pickle.dumps(make_math_verify_reward(timeout_seconds=2.0, name="mv")))
    assert restored.__name__ == "mv"
    assert restored.timeout_seconds == 2.0
    assert restored([r"\boxed{2}"], ["2"]) == [1.0]


def test_builtin_rewards():
    from trl.rewards import accuracy_reward, think_format_reward

    from vcppo_trl.rewards.reasoning_gym import reasoning_gym_reward

    assert BUILTIN_REWARDS == {
        "math_verify": math_verify_reward,
        "think_format": think_format_reward,
        "accuracy": accuracy_reward,
        "reasoning_gym": reasoning_gym_reward,
    }


def test_resolve_reward_funcs_names_and_paths():
    from trl.rewards import think_format_reward

    assert resolve_reward_funcs("math_verify") == [math_verify_reward]
    assert resolve_reward_funcs(["math_verify", "think_format"]) == [math_verify_reward, think_format_reward]
    assert resolve_reward_funcs("math_verify, accuracy") == [math_verify_reward, BUILTIN_REWARDS["accuracy"]]
    assert resolve_reward_funcs(["vcppo_trl.rewards.math_verify_reward"]) == [math_verify_reward]
    assert resolve_reward_funcs(["vcppo_trl.rewards:make_math_verify_reward"]) == [make_math_verify_reward]
    assert resolve_reward_funcs(["trl.rewards.think_format_reward"]) == [think_format_reward]
    custom = make_math_verify_reward(name="custom")
    assert resolve_reward_funcs([custom, "math_verify"]) == [custom, math_verify_reward]


@pytest.mark.parametrize(
    "spec",
    ["no_such_reward", "no_such_pkg.module.func", "vcppo_trl.rewards.no_such_func", "vcppo_trl.rewards:no_such_func"],
)
def test_resolve_reward_funcs_errors(spec):
    with pytest.raises(ValueError) as error:
        resolve_reward_funcs([spec])
    message = str(error.value)
    assert repr(spec) in message
    for name in BUILTIN_REWARDS:
        assert name in message
    assert "my_pkg.module.func" in message and "my_pkg.module:func" in message


def test_resolve_reward_funcs_non_callable():
    with pytest.raises(ValueError, match="non-callable"):
        resolve_reward_funcs("vcppo_trl.rewards.DEFAULT_TIMEOUT_SECONDS")
