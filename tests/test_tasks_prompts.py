"""Prompt templates: shipped verbatim, rendered with braces-safe substitution, plain and chat forms."""

from __future__ import annotations

import pytest
from conftest import REPO_ROOT, shared_path

from trl_ext.tasks import CHAT_PROMPTS, PROMPTS, countdown_prompt, format_prompt, get_prompt

PROMPT_FILES = ("r1_zero", "question_only", "countdown", "intellect")
# NLPDL HW3 prints its R1-Zero prompt with two words that its own prompt file (data/r1_zero.prompt), CS336's and the
# one shipped here do not have: "takes" for "asks", "them" for "then". The recipes use the file's wording.
R1_ZERO_PRINTED_TO_SHIPPED = {
    "The User takes a question": "The User asks a question",
    "and them provides": "and then provides",
}


def course_prompt(name: str) -> str:
    """A prompt as a course prints it, typed into tests/data/course_prompts (its README says from where)."""
    return shared_path("course_prompts", name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", PROMPT_FILES)
def test_shipped_prompts_are_the_package_files(name):
    path = REPO_ROOT / "trl_ext" / "tasks" / "prompts" / f"{name}.prompt"
    assert PROMPTS[name] == path.read_text(encoding="utf-8")


def test_countdown_prompt_as_nyu_a3_prints_it():
    """Section 5's prompt with its example problem: "in the list", and the question, the constraint and "Your
    solution ..." each on a line of its own."""
    assert countdown_prompt([96, 97, 68], 125, prompt="countdown") == course_prompt("nyu_reasoners_a3_countdown.txt")
    assert countdown_prompt([96, 97, 68], 125, prompt="countdown", chat=True) == [
        {"role": "user", "content": course_prompt("nyu_reasoners_a3_countdown.txt")}
    ]


def test_intellect_prompt_as_nyu_a3_prints_it():
    assert PROMPTS["intellect"] == course_prompt("nyu_reasoners_a3_intellect.txt")


def test_r1_zero_is_nlpdl_hw3s_printed_prompt_with_its_files_two_words():
    printed = course_prompt("nlpdl_hw3_r1_zero.txt")
    shipped = printed
    for seed_words, file_words in R1_ZERO_PRINTED_TO_SHIPPED.items():
        assert printed.count(seed_words) == 1
        shipped = shipped.replace(seed_words, file_words)
    assert PROMPTS["r1_zero"] == shipped
    # the two words are the only difference
    assert [a for a, b in zip(printed.split(" "), PROMPTS["r1_zero"].split(" "), strict=True) if a != b] == [
        "takes",
        "them",
    ]


def test_question_only_as_seeds_002_and_003_print_it():
    assert PROMPTS["question_only"] == course_prompt("question_only.txt") == "{question}"


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
    text = format_prompt(
        "countdown", question="Using the numbers in the list [1, 2], create an equation that equals 3."
    )
    assert text.startswith("Answer the following problem.")
    assert (
        "Problem\nUsing the numbers in the list [1, 2], create an equation that equals 3.\nYour solution should"
        in text
    )
    assert format_prompt("compact", numbers="[14, 1, 10]", target=5) == "[14, 1, 10] -> 5 :"


def test_kissing_prompts_as_nlpdl_hw3_prints_them():
    """Section 7.4's three prompts: the task (baseline), and the loop's turns after a failed and a valid attempt. The
    assignment's example error and its "[Your Score]" fill the placeholders; each prompt is followed by our one line
    asking for a fenced program (what the verifier reads)."""
    from trl_ext.discover import FAILURE_PROMPT, SUCCESS_PROMPT, feedback_prompt
    from trl_ext.tasks.kissing import ANSWER_FORMAT, KISSING_PROMPT, kissing_prompt

    baseline = course_prompt("nlpdl_hw3_kissing_baseline.txt")
    assert KISSING_PROMPT.format(dimension=11) == baseline
    assert kissing_prompt() == kissing_prompt(11) == f"{baseline}\n\n{ANSWER_FORMAT}"
    error = "Minimum squared distance 36 < maximum squared norm 40"  # the course's example
    assert FAILURE_PROMPT.format(message=error) == course_prompt("nlpdl_hw3_kissing_failure.txt")
    assert SUCCESS_PROMPT.format(score="[Your Score]") == course_prompt("nlpdl_hw3_kissing_success.txt")
    failed = {"validity": 0.0, "score": 0, "message": error}
    assert feedback_prompt(failed) == f"{course_prompt('nlpdl_hw3_kissing_failure.txt')}\n\n{ANSWER_FORMAT}"
    valid = {"validity": 1.0, "score": 582, "message": "valid"}
    success = course_prompt("nlpdl_hw3_kissing_success.txt").replace("[Your Score]", "582")
    assert feedback_prompt(valid) == f"{success}\n\n{ANSWER_FORMAT}"
