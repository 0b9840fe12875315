"""The per-call context check of vLLM generation (`check_prompts_fit`): what the start-up check cannot see."""

import pytest

from vcppo_trl.sampling.vllm_checks import check_prompts_fit


def test_prompts_that_fit_pass_and_the_first_that_does_not_is_named_with_its_lengths():
    check_prompts_fit([10, 384], max_new_tokens=128, max_model_length=512)  # exactly the context: fits
    check_prompts_fit([], max_new_tokens=512, max_model_length=512)
    with pytest.raises(ValueError, match=r"A prompt of 385 tokens plus up to 128 new tokens .*=512"):
        check_prompts_fit([10, 385], max_new_tokens=128, max_model_length=512)
