"""Prompt templates: shipped verbatim, rendered with braces-safe substitution, plain and chat forms."""

from __future__ import annotations

import hashlib

import pytest
from conftest import REPO_ROOT

from trl_ext.tasks import CHAT_PROMPTS, PROMPTS, format_prompt, get_prompt

PROMPT_FILES = ("r1_zero", "question_only", "countdown", "intellect")
SEED_PROMPT_SHA256 = {
    "r1_zero": "56213732da87e12ace60a2b88a16df0af18280fb0563a957cbecc938a6a2ac0e",
    "question_only": "bf085a6e12c9d0e23a9dd157df084f933b2ef021caba82def1494bfb84a723c9",
    "countdown": "09283ead5be7f30437314bc174ae781e2043a8c7b21e2cbb21894bd9e77f9e05",
    "intellect": "fb3574ef5303a1d0c204ab47f25f4c2f916b933525a9c77e1b2c7bb798dda300",
}


@pytest.mark.parametrize("name", PROMPT_FILES)
def test_shipped_prompts_are_the_seed_files_verbatim(name):
    path = REPO_ROOT / "trl_ext" / "tasks" / "prompts" / f"{name}.prompt"
    assert PROMPTS[name] == path.read_text(encoding="utf-8")
    # SHA-256 of the seed experiments' prompt files (as in ../shared/data/prompts): catches any edit of a shipped copy.
    assert hashlib.sha256(PROMPTS[name].encode("utf-8")).hexdigest() == SEED_PROMPT_SHA256[name]


def test_prompt_names_and_unknown_name_lists_them():
    assert set(PROMPTS) == {"r1_zero", "question_only", "countdown", "intellect", "tinyzero", "compact"}
    assert set(CHAT_PROMPTS) == set(PROMPTS)
    with pytest.raises(ValueError, match="unknown prompt 'r1-zero'.*compact.*r1_zero.*tinyzero"):
        get_prompt("r1-zero")
    with pytest.raises(ValueError, match="valid prompts"):
        format_prompt("nope", question="x")


def test_tinyzero_prompt_text():
    expected = (
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
        "assistant first thinks about the reasoning process in the mind and then provides the user with the "
        "answer.\nUser: Q Show your work in <think> </think> tags. And return the final answer in <answer> "
        "</answer> tags, for example <answer> (1 + 2) / 3 </answer>.\nAssistant: Let me solve this step by step."
        "\n<think>"
    )
    assert format_prompt("tinyzero", question="Q") == expected
    assert format_prompt("tinyzero", chat=True, question="Q") == [
        {
            "role": "user",
            "content": "Q Show your work in <think> </think> tags. And return the final answer in <answer> </answer> "
            "tags, for example <answer> (1 + 2) / 3 </answer>.",
        }
    ]


def test_r1_zero_plain_and_chat():
    question = r"What is $\frac{1}{2}$ of {x}?"  # braces must survive (no str.format)
    plain = format_prompt("r1_zero", question=question)
    assert plain.endswith(f"User: {question}\nAssistant: <think>")
    assert plain.startswith("A conversation between User and Assistant.")
    (message,) = format_prompt("r1_zero", chat=True, question=question)
    assert message["role"] == "user"
    assert plain == message["content"] + "\nAssistant: <think>"


def test_intellect_is_a_system_prompt():
    question = r"Find $\sqrt{16}$."
    assert format_prompt("intellect", question=question) == PROMPTS["intellect"] + "\n\n" + question
    assert r"$\boxed{answer}$" in PROMPTS["intellect"]
    assert format_prompt("intellect", chat=True, question=question) == [
        {"role": "system", "content": PROMPTS["intellect"]},
        {"role": "user", "content": question},
    ]


def test_question_only_and_countdown_templates():
    assert format_prompt("question_only", question="2+2?") == "2+2?"
    text = format_prompt("countdown", question="Using the numbers [1, 2], create an equation that equals 3.")
    assert text.startswith("Answer the following problem.")
    assert "Problem\nUsing the numbers [1, 2], create an equation that equals 3. Your solution should" in text
    assert format_prompt("compact", numbers="[14, 1, 10]", target=5) == "[14, 1, 10] -> 5 :"
