"""Verifier-guided discovery (seed 002, section 7): a model writes programs, the sandbox and the verifier score them.

`trl-ext discover` samples programs that define `points` from an OpenAI-compatible endpoint or a local transformers
model, scores each with `trl_ext.rewards.kissing` (sandbox + exact verifier), keeps the best valid one (Best@N) and
feeds the verifier's message back for the next round (iterative refinement). Modules: `backends` (HTTP / local
model), `loop` (the rounds and the files), `report` (report.md), `cli` (the Typer command); `check` is
`trl-ext kissing-check`, section 7.3's evaluator for an existing program. Importing this package is light: torch and
numpy load only when a backend or the verifier runs.
"""

from trl_ext.discover.backends import BackendError, OpenAIChatBackend, TransformersChatBackend
from trl_ext.discover.loop import FAILURE_PROMPT, SUCCESS_PROMPT, DiscoveryConfig, feedback_prompt, run_discovery

__all__ = [
    "FAILURE_PROMPT",
    "SUCCESS_PROMPT",
    "BackendError",
    "DiscoveryConfig",
    "OpenAIChatBackend",
    "TransformersChatBackend",
    "feedback_prompt",
    "run_discovery",
]
