"""Verifier-guided discovery (NLPDL HW3, section 7): a model writes programs, the sandbox and the verifier score them.

`trl-ext discover` samples programs that define `points` from an OpenAI-compatible endpoint or a local transformers
model, scores each with `trl_ext.rewards.kissing` (sandbox + exact verifier), keeps the best valid one (Best@N) and
feeds the verifier's message back for the next round, with the conversation so far (iterative refinement). Modules:
`backends` (HTTP / local model), `loop` (the rounds and the files), `report` (report.md in the assignment's sections),
`cli` (the Typer command); `check` is `trl-ext kissing-check`, section 7.3's evaluator for an existing program.
Importing this package is light: torch and numpy load only when a backend or the verifier runs, and the public names
below load their modules on first use (`trl-ext kissing-check` and `trl-ext --help` import none of them).
"""

from trl_ext.lazy import lazy_names

_LAZY = {
    "BackendError": "trl_ext.discover.backends",
    "OpenAIChatBackend": "trl_ext.discover.backends",
    "TransformersChatBackend": "trl_ext.discover.backends",
    "FAILURE_PROMPT": "trl_ext.discover.loop",
    "SUCCESS_PROMPT": "trl_ext.discover.loop",
    "SYSTEM_PROMPT": "trl_ext.discover.loop",
    "DiscoveryConfig": "trl_ext.discover.loop",
    "conversation": "trl_ext.discover.loop",
    "feedback_prompt": "trl_ext.discover.loop",
    "run_discovery": "trl_ext.discover.loop",
}

__all__ = [
    "FAILURE_PROMPT",
    "SUCCESS_PROMPT",
    "SYSTEM_PROMPT",
    "BackendError",
    "DiscoveryConfig",
    "OpenAIChatBackend",
    "TransformersChatBackend",
    "conversation",
    "feedback_prompt",
    "run_discovery",
]


__getattr__ = lazy_names(__name__, _LAZY)
