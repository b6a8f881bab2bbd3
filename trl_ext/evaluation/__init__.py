"""Zero-shot evaluation: sample n completions per problem, score them with the training rewards, report
accuracy, the courses' three outcome categories, pass@N and Best@N, for one or several generation budgets.

Pipeline (one function per arrow): task rows (`trl_ext.tasks.load_task`) -> prompt strings (chat template when
`chat`) -> samples with per-token log-probabilities (vLLM on a GPU or with its CPU build, else
`transformers.generate`; `backend` picks) -> cut at the first `</answer>` / EOS / the budget -> reward components
(`trl_ext.rewards`, the same functions training uses) -> `generations.jsonl` + `summary.json` + `pass_at_n.png` per
budget.

How the budgets share samples: autoregressive sampling is prefix-consistent (the first L tokens of a sample drawn
with budget L' > L are distributed exactly as a sample drawn with budget L, same stop rule), so we sample once with
the largest `max_tokens` and cut each sample to every smaller budget, instead of sampling again.

Stop rule, as the courses' vLLM `SamplingParams(stop=["</answer>"], include_stop_str_in_output=True)`: a response
ends right after the first `</answer>` (kept in the text) or at EOS. The transformers backend passes
`stop_strings=` to `generate` and, as a token may run past the stop string (`"</answer>."`), also cuts the decoded
text after the first `</answer>` itself.

Mean token log-probability (the Best@N score): the mean over the response's generated tokens (stop / EOS token
included) of log p(token | prefix) under the model's raw distribution (temperature 1, no top-p), i.e. what vLLM
returns with its default `logprobs_mode="raw_logprobs"`. The transformers backend records it during generation
from the unprocessed logits, so no second forward pass is needed.

Categories (Assignment 2): `format1_answer1` (format reward 1 and answer reward 1), `format1_answer0`, `format0`.
Accuracy is the mean answer reward; pass@1 equals it.

Modules, one job each: `config` (`EvalConfig`), `samples` (a sample and its cut), `backend` (which backend `auto` runs,
and why), `transformers_backend` and `vllm_backend` (generation), `scoring` (reward components and records), `summary`
(pass@N / Best@N, categories; the estimators in `passk`), `pipeline` (`evaluate_model` in memory, `evaluate` with
files, `evaluate_pair` for two models on the same problems), `compare` (the two models' verdicts per problem). A
library: it knows nothing of recipes (`trl_ext.recipes.evaluation` turns a recipe into an `EvalConfig`;
`trl_ext.recipes.eval_command` is `trl-ext eval`). The names below load their modules on first use.
"""

from trl_ext.lazy import lazy_names

_LAZY = {
    "BACKENDS": "trl_ext.evaluation.config",
    "REWARD_NAMES": "trl_ext.evaluation.config",
    "STOP": "trl_ext.evaluation.config",
    "TASK_NAMES": "trl_ext.evaluation.config",
    "EvalConfig": "trl_ext.evaluation.config",
    "check_model_name": "trl_ext.evaluation.config",
    "parse_int_list": "trl_ext.evaluation.config",
    "OUTCOMES": "trl_ext.evaluation.compare",
    "compare_records": "trl_ext.evaluation.compare",
    "compare_runs": "trl_ext.evaluation.compare",
    "problem_verdicts": "trl_ext.evaluation.compare",
    "evaluate": "trl_ext.evaluation.pipeline",
    "evaluate_pair": "trl_ext.evaluation.pipeline",
    "evaluate_model": "trl_ext.evaluation.pipeline",
    "load_problems": "trl_ext.evaluation.pipeline",
    "render_prompts": "trl_ext.evaluation.pipeline",
    "resolve_backend": "trl_ext.evaluation.pipeline",
    "Sample": "trl_ext.evaluation.samples",
    "cut_sample": "trl_ext.evaluation.samples",
    "cut_samples": "trl_ext.evaluation.samples",
    "CATEGORIES": "trl_ext.evaluation.scoring",
    "RewardComponentsFn": "trl_ext.evaluation.scoring",
    "category": "trl_ext.evaluation.scoring",
    "ground_truth_of": "trl_ext.evaluation.scoring",
    "reward_name_for": "trl_ext.evaluation.scoring",
    "score_response": "trl_ext.evaluation.scoring",
    "score_samples": "trl_ext.evaluation.scoring",
    "format_report": "trl_ext.evaluation.summary",
    "summarize": "trl_ext.evaluation.summary",
    "eos_token_ids": "trl_ext.evaluation.transformers_backend",
    "generate_transformers": "trl_ext.evaluation.transformers_backend",
    "load_model_and_tokenizer": "trl_ext.evaluation.transformers_backend",
    "generate_vllm": "trl_ext.evaluation.vllm_backend",
    "vllm_engine_kwargs": "trl_ext.evaluation.vllm_backend",
    "vllm_sampling_kwargs": "trl_ext.evaluation.vllm_backend",
}

__all__ = [
    "BACKENDS",
    "CATEGORIES",
    "EvalConfig",
    "OUTCOMES",
    "REWARD_NAMES",
    "RewardComponentsFn",
    "STOP",
    "Sample",
    "TASK_NAMES",
    "category",
    "check_model_name",
    "compare_records",
    "compare_runs",
    "cut_sample",
    "cut_samples",
    "eos_token_ids",
    "evaluate",
    "evaluate_model",
    "evaluate_pair",
    "format_report",
    "generate_transformers",
    "generate_vllm",
    "ground_truth_of",
    "load_model_and_tokenizer",
    "load_problems",
    "parse_int_list",
    "problem_verdicts",
    "render_prompts",
    "resolve_backend",
    "reward_name_for",
    "score_response",
    "score_samples",
    "summarize",
    "vllm_engine_kwargs",
    "vllm_sampling_kwargs",
]


__getattr__ = lazy_names(__name__, _LAZY)
