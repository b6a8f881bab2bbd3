"""Which models keep packed rows apart: the allow-list `padding_free` trusts, verified against transformers 5.17.

Packing puts a micro-batch's rows one after another in one sequence, `position_ids` restarting at 0 for each row and
no attention mask (`trl_ext.grpo.packing`). transformers turns the restarts into sequence boundaries in one place:
`masking_utils._preprocess_mask_arguments` calls `find_packed_sequence_indices(position_ids)` only when the model
passed `position_ids` to `create_causal_mask` / `create_sliding_window_causal_mask`, the attention mask is None and
`past_key_values` is None. A model that builds its mask without `position_ids` lets each packed row attend to the rows
before it: Falcon (`FalconModel.forward`, a materialised mask for ALiBi) and Bloom build it without them. A model with
absolute position embeddings (GPT-2) differs from the padded forward even with them: TRL's padded rows count
positions from the left padding. Nothing in a model's config says which case it is, so `padding_free` accepts only the
model types below, each verified two ways:

- read in transformers 5.17's `modeling_<type>.py`: the base model's forward passes `position_ids` to every mask it
  builds (`"position_ids": position_ids` in its `mask_kwargs`, or `position_ids=position_ids`), positions enter only
  through RoPE (relative), no layer mixes tokens other than attention (no convolution, recurrence or ALiBi), and
  each attention module hands its `**kwargs` to the attention function (the flash-attention varlen arguments
  `trl_ext.grpo.packing` passes reach it);
- tested: tests/test_packed_models.py builds a random tiny model of each type from its config and checks that the
  packed forward's logits equal the padded forward's (sdpa and eager), and that the varlen arguments reach every
  layer's attention call.

Prompt-learning PEFT (prefix tuning, prompt tuning, p-tuning ...) is refused whatever the model: prefix tuning passes
`past_key_values` (the check above is skipped), the others prepend virtual tokens and drop `position_ids`.
"""

from __future__ import annotations

from trl_ext.preflight.models import read_model_config
from trl_ext.preflight.problems import Problem

# model type -> the transformers 5.17 source that builds its masks with position_ids (read for the list above).
PACKED_MODEL_TYPES: dict[str, str] = {
    "llama": "models/llama/modeling_llama.py LlamaModel.forward: create_causal_mask(position_ids=position_ids)",
    "mistral": "models/mistral/modeling_mistral.py MistralModel.forward: mask_function(position_ids=position_ids)",
    "qwen2": "models/qwen2/modeling_qwen2.py Qwen2Model.forward: mask_kwargs['position_ids'], full and sliding",
    "qwen2_moe": "models/qwen2_moe/modeling_qwen2_moe.py Qwen2MoeModel.forward: mask_kwargs['position_ids']",
    "qwen3": "models/qwen3/modeling_qwen3.py Qwen3Model.forward: mask_kwargs['position_ids'], full and sliding",
    "qwen3_moe": "models/qwen3_moe/modeling_qwen3_moe.py Qwen3MoeModel.forward: mask_function(position_ids=...)",
    "gemma": "models/gemma/modeling_gemma.py GemmaModel.forward: create_causal_mask(position_ids=position_ids)",
    "gemma2": "models/gemma2/modeling_gemma2.py Gemma2Model.forward: mask_kwargs['position_ids'], full and sliding",
    "gemma3_text": "models/gemma3/modeling_gemma3.py Gemma3TextModel.forward: mask_kwargs / sliding_mask_kwargs",
    "olmo2": "models/olmo2/modeling_olmo2.py Olmo2Model.forward: create_causal_mask(position_ids=position_ids)",
    "phi3": "models/phi3/modeling_phi3.py Phi3Model.forward: mask_function(position_ids=position_ids)",
    "smollm3": "models/smollm3/modeling_smollm3.py SmolLM3Model.forward: mask_kwargs['position_ids']",
    "granite": "models/granite/modeling_granite.py GraniteModel.forward: create_causal_mask(position_ids=...)",
}


def model_type_problem(model_type: str | None) -> str | None:
    """Why packed rows of this model type may attend to each other, or None when the type is on the allow-list."""
    if model_type in PACKED_MODEL_TYPES:
        return None
    return (
        f"model type {model_type!r} is not known to keep packed rows apart (transformers separates them only where "
        "the model passes position_ids to its mask builder and positions are relative; verified for "
        f"{', '.join(sorted(PACKED_MODEL_TYPES))}), so its rows could attend to each other"
    )


def prompt_learning_problem(peft_type: str) -> str:
    """Why a prompt-learning PEFT adapter (`peft_type`, e.g. PREFIX_TUNING) cannot train packed rows."""
    return (
        f"PEFT {peft_type} is prompt learning: it feeds the model past_key_values (prefix tuning) or virtual tokens "
        "without position_ids, and transformers then does not separate the packed rows, which would attend to each "
        "other"
    )


def padding_free_problems(model_name_or_path: str) -> list[Problem]:
    """`padding_free` on this model, before it loads: a problem when its config (local folder, hub cache or a shipped
    model) names a model type off the allow-list; nothing when the config cannot be read offline (the trainer checks
    the loaded model)."""
    config, _ = read_model_config(model_name_or_path)
    if config is None:
        return []
    problem = model_type_problem(config.get("model_type"))
    if problem is None:
        return []
    return [Problem("padding_free", f"{model_name_or_path}: {problem}", "set padding_free: false")]
