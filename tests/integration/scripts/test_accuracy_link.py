"""The accuracy-link toy's task measurements (experiments/accuracy_link_shape.py): the texts that force an answer
without reasoning or after k lines, and the reading of the model's forced answer."""

import accuracy_link_shape as shape
import torch

from vcppo_trl.toy import build_tiny_model, build_tokenizer, running_sum
from vcppo_trl.toy.majority import format_prompt, format_solution, leader_after, majority_reward, reasoning_lines


def test_no_reasoning_text_closes_the_reasoning_at_once():
    prompt = format_prompt([1, 0, 1], encoding="changes")
    text = shape.no_reasoning_text(prompt)
    assert text == prompt + "<think></think> \\boxed{"
    assert reasoning_lines(text[len(prompt) :]) == 0


def test_forced_stop_text_holds_k_exact_lines_and_is_scored_against_the_whole_answer():
    bits = [1, 1, 0, 0, 0]  # leader after 2 lines: 1; the whole string's majority: 0
    prompt = format_prompt(bits, encoding="changes")
    text = shape.forced_stop_text(prompt, format_solution(bits, stop_line=2, encoding="changes"))
    assert text.endswith("</think> \\boxed{") and reasoning_lines(text[len(prompt) :]) == 2
    full = format_solution(bits, stop_line=2, encoding="changes")
    assert text[len(prompt) :] == full.split("</think>")[0] + "</think> \\boxed{"
    # An answer after 2 lines (the leader so far) is scored against the whole string's majority: wrong here.
    answered = text[len(prompt) :] + f"{leader_after(bits, 2)}}}"
    assert majority_reward([answered], ["\\boxed{0}"]) == [-1.0]
    assert majority_reward([text[len(prompt) :] + "0}"], ["\\boxed{0}"]) == [1.0]


def test_running_sum_candidate_reads_the_problem_and_scores_an_early_answer_against_the_whole_sum():
    candidate = shape.CANDIDATES["sum-mod-5"]
    digits = [3, 4, 1, 0]  # running sums 3, 2, 3, 3
    prompt = running_sum.format_prompt(digits)
    assert candidate.num_lines(prompt) == 4 and candidate.chance == 0.2
    assert [candidate.answer_after(prompt, k) for k in range(1, 5)] == ["3", "2", "3", "3"]
    text = shape.forced_stop_text(prompt, candidate.reference(prompt, 2))
    assert text == prompt + "<think>a3 3\nb4 2\n</think> \\boxed{"
    assert candidate.reasoning_lines(text[len(prompt) :]) == 2
    # The exact state after 2 lines answers 2; the whole sum is 3.
    assert not candidate.is_correct(text[len(prompt) :] + "2}", "\\boxed{3}")
    assert candidate.is_correct(text[len(prompt) :] + "3}", "\\boxed{3}")
    parity = shape.CANDIDATES["parity"]
    assert parity.chance == 0.5 and parity.answers == ("0", "1") and parity.budget.modulus == 2
    assert parity.budget.asset_key() != candidate.budget.asset_key()
    # The majority candidate reads the same way.
    majority = shape.CANDIDATES["majority-changes"]
    bits = [1, 1, 0, 0, 0]
    assert majority.answer_after(format_prompt(bits, encoding="changes"), 2) == str(leader_after(bits, 2)) == "1"
    assert majority.answer_after(format_prompt(bits, encoding="changes"), 5) == "0"


def test_forced_answers_reads_the_greedy_answer_up_to_the_brace():
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0).eval()
    answer_ids = tokenizer("1}", add_special_tokens=False)["input_ids"]

    def generate(input_ids, attention_mask=None, max_new_tokens=4, **kwargs):
        # A model that always answers "1}" (then pads): what forced_answers must read as "1".
        tail = torch.tensor(answer_ids + [tokenizer.pad_token_id] * (max_new_tokens - len(answer_ids)))
        return torch.cat([input_ids, tail.expand(input_ids.shape[0], -1)], dim=1)

    model.generate = generate
    texts = [shape.no_reasoning_text(format_prompt([1, 0, 1])), shape.no_reasoning_text(format_prompt([0] * 5))]
    assert shape.forced_answers(model, tokenizer, texts) == ["1", "1"]
    # Without a closing brace within the tokens read, no answer.
    zeros = torch.tensor(tokenizer("0000", add_special_tokens=False)["input_ids"])
    model.generate = lambda input_ids, **kw: torch.cat([input_ids, zeros.expand(input_ids.shape[0], -1)], dim=1)
    assert shape.forced_answers(model, tokenizer, texts[:1]) == [None]
