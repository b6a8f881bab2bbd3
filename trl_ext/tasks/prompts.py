"""Prompt templates of the courses, shipped with the package.

Four templates are the course files in `trl_ext/tasks/prompts/*.prompt`, loaded verbatim through importlib.resources:
`r1_zero`, `question_only`, `countdown` (NYU Assignment 3), `intellect` (a system prompt, no placeholder). Two live
here as code because no file exists for them: `tinyzero` (the TinyZero / Assignment 2 Countdown prompt, character for
character the text in TinyZero's preprocessed parquet) and `compact` (the tiny CPU demo's `"[14, 1, 10] -> 5 :"`).

Placeholders are `{question}` (and `{numbers}`, `{target}` for `compact`). They are filled with `str.replace`, never
`str.format`: `intellect` contains `$\\boxed{answer}$` and MATH questions are full of braces.

Plain text (`chat=False`) is the whole template, for base models. Chat (`chat=True`) is a list of messages for the
tokenizer's chat template, which supplies the assistant turn itself, so an assistant prefix in the plain text is
dropped there:

| name | plain text | chat messages |
|---|---|---|
| r1_zero | the template, ends with `Assistant: <think>` | user: the template without `\\nAssistant: <think>` |
| question_only | `{question}` | user: the question |
| countdown | the NYU Assignment 3 template | user: the same text |
| intellect | the system prompt, a blank line, the question | system: the prompt; user: the question |
| tinyzero | TinyZero's base-model template | user: TinyZero's user text (question and tag instruction) |
| compact | `{numbers} -> {target} :` | user: the same text |
"""

from __future__ import annotations

from importlib import resources

_FILE_PROMPTS = ("r1_zero", "question_only", "countdown", "intellect")


def _read_prompt_file(name: str) -> str:
    return resources.files("trl_ext.tasks").joinpath("prompts", f"{name}.prompt").read_text(encoding="utf-8")


# TinyZero (examples/data_preprocess/countdown.py, template_type="base"); the question is COUNTDOWN_QUESTION.
TINYZERO_USER = (
    "{question} Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, "
    "for example <answer> (1 + 2) / 3 </answer>."
)
TINYZERO_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer."
    "\nUser: " + TINYZERO_USER + "\nAssistant: Let me solve this step by step.\n<think>"
)
COMPACT_PROMPT = "{numbers} -> {target} :"

#: Plain-text templates by name.
PROMPTS: dict[str, str] = {name: _read_prompt_file(name) for name in _FILE_PROMPTS}
PROMPTS["tinyzero"] = TINYZERO_PROMPT
PROMPTS["compact"] = COMPACT_PROMPT

_R1_ZERO_ASSISTANT_PREFIX = "\nAssistant: <think>"
if not PROMPTS["r1_zero"].endswith(_R1_ZERO_ASSISTANT_PREFIX):  # the shipped file is the contract; fail loudly
    raise RuntimeError("trl_ext/tasks/prompts/r1_zero.prompt no longer ends with 'Assistant: <think>'")

#: User-message templates for `chat=True` (see the module docstring); `intellect` is the system message instead.
CHAT_PROMPTS: dict[str, str] = {
    "r1_zero": PROMPTS["r1_zero"][: -len(_R1_ZERO_ASSISTANT_PREFIX)],
    "question_only": PROMPTS["question_only"],
    "countdown": PROMPTS["countdown"],
    "intellect": "{question}",
    "tinyzero": TINYZERO_USER,
    "compact": COMPACT_PROMPT,
}

#: Prompts whose text carries a system message in chat form.
SYSTEM_PROMPTS: dict[str, str] = {"intellect": PROMPTS["intellect"]}


def get_prompt(name: str, chat: bool = False) -> str:
    """Template text of prompt `name` (the user-message template when `chat`); unknown name -> ValueError."""
    table = CHAT_PROMPTS if chat else PROMPTS
    if name not in table:
        raise ValueError(f"unknown prompt {name!r}; valid prompts: {', '.join(sorted(table))}")
    return table[name]


def _fill(template: str, fields: dict[str, object]) -> str:
    for key, value in fields.items():
        template = template.replace("{" + key + "}", str(value))
    return template


def format_prompt(name: str, chat: bool = False, **fields: object) -> str | list[dict[str, str]]:
    """Render prompt `name` with `fields` (`question=...`, or `numbers=...`/`target=...` for `compact`).

    Returns:
        The prompt string (`chat=False`) or chat messages `[{"role": "user", "content": ...}]`, preceded by a
        system message for `intellect`.

    Example:
        >>> format_prompt("question_only", question="1+1?")
        '1+1?'
    """
    if name == "intellect" and not chat:
        return PROMPTS["intellect"] + "\n\n" + str(fields.get("question", ""))
    user = _fill(get_prompt(name, chat=chat), fields)
    if not chat:
        return user
    messages = [{"role": "user", "content": user}]
    if name in SYSTEM_PROMPTS:
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPTS[name]})
    return messages
