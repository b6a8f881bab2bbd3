"""Resolve `AblationGRPOConfig`'s objective axes from the fields a user set: ours, the courses' presets, TRL's names.

Pure: the config's values in, the resolved values and warnings out (`AblationGRPOConfig.__post_init__` applies them).
"Unset" is `None` (every field read here defaults to `None`), so an explicit value is never mistaken for a default.

1. An explicit field wins. An unset axis takes what TRL's vocabulary implies, TRL's defaults included: `loss_type`
   (default "dapo") gives the loss and the reduction, `scale_rewards` (default "group") the advantage, with TRL's
   `epsilon=0.2` and advantage eps 1e-4. So with no field set the config trains what `trl.GRPOConfig()` trains.
2. Two explicit fields that say different things are an error naming both.
3. An explicit field that the resolved combination ignores is an error. The one exception is the drop-in rule: when
   the loss comes from TRL's `loss_type` (no `pg_loss_type` given), a TRL field that TRL itself would ignore
   (`epsilon` under `sapo`, say) is a warning, because `trl.GRPOConfig` accepts it.

The courses' `pg_loss_type` names are presets: `no_baseline` = raw advantages + `reinforce`, `reinforce_with_baseline`
= a baselined advantage + `reinforce`; `grpo_clip` / `grpo_no_clip` are loss names themselves. `use_std_normalization`
chooses between `group_mean_std` and `group_mean`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl_ext.objectives import (
    ADVANTAGE_TYPES,
    ADVANTAGES,
    LENGTH_NORMALIZATIONS,
    MULTI_OBJECTIVE_AGGREGATIONS,
    PG_LOSS_TYPES,
    PG_LOSSES,
)

# TRL 1.16 loss_type -> (pg_loss_type, length_normalization); dr_grpo's constant is max_completion_length.
TRL_LOSS_TYPES = {
    "grpo": ("grpo_clip", "masked_mean"),
    "bnpo": ("grpo_clip", "microbatch_token_mean"),
    "dr_grpo": ("grpo_clip", "masked_normalize"),
    "dapo": ("grpo_clip", "token_mean"),
    "cispo": ("cispo", "token_mean"),
    "sapo": ("sapo", "masked_mean"),
    "luspo": ("grpo_clip", "seq_mean_token_sum"),
    "vespo": ("vespo", "token_mean"),
}
TRL_SCALE_REWARDS = {"group": "group_mean_std", "none": "group_mean", "batch": "batch_std"}
SCALE_REWARDS_ALIASES = {True: "group", False: "none", "true": "group", "false": "none"}
# The courses' pg_loss_type presets: the loss they train and the advantage they imply ("baseline": any but raw).
PG_LOSS_PRESETS = {"no_baseline": ("reinforce", "raw"), "reinforce_with_baseline": ("reinforce", "baseline")}
PG_LOSS_CHOICES: tuple[str, ...] = (*PG_LOSS_PRESETS, *PG_LOSS_TYPES)
TRL_DEFAULT_LOSS_TYPE, TRL_ADVANTAGE_EPS, TRL_EPSILON = "dapo", 1e-4, 0.2
# Losses whose ratio is per sequence by definition.
SEQUENCE_LEVEL_LOSSES = ("gspo", "luspo")
# TRL fields that parameterise a loss; a loss uses the ones it declares (see trl_ext.objectives.losses).
LOSS_FIELDS = ("epsilon", "epsilon_high", "delta", "importance_sampling_level")
# Every config field `resolve_axes` reads. Setting one of them on the command line can make a value a recipe YAML
# states for another one meaningless (`--pg_loss_type no_baseline` under a recipe's `use_std_normalization: true`);
# the recipe parser then drops that value (`trl_ext.recipes.parsing`).
AXIS_FIELDS = (
    "advantage_type",
    "pg_loss_type",
    "length_normalization",
    "use_std_normalization",
    "advantage_eps",
    "normalize_constant",
    "loss_type",
    "scale_rewards",
    "multi_objective_aggregation",
    "max_completion_length",
    "beta",
    "use_bias_correction_kl",
    *LOSS_FIELDS,
)


@dataclass
class ResolvedAxes:
    """The values `AblationGRPOConfig` ends up with; `loss_type` / `scale_rewards` are TRL's names for the same
    combination (None when TRL has none)."""

    advantage_type: str | None
    pg_loss_type: str
    length_normalization: str
    advantage_eps: float | None
    normalize_constant: float | None
    epsilon: float | None
    epsilon_high: float | None
    importance_sampling_level: str
    loss_type: str | None
    scale_rewards: str | None
    warnings: list[str] = field(default_factory=list)


class AxisFieldError(ValueError):
    """An axis error that names its fields, so a caller that knows where each value came from can say what to unset.

    Attributes:
        fields: the explicit fields at fault: the ignored one, or the two that contradict each other.
        ignored: the resolved combination ignores `fields[0]`: unsetting it changes nothing that trains.
    """

    def __init__(self, message: str, fields: tuple[str, ...], ignored: bool) -> None:
        super().__init__(message)
        self.fields = fields
        self.ignored = ignored


def _conflict(a: str, a_value: object, b: str, b_value: object, why: str) -> AxisFieldError:
    return AxisFieldError(f"{a}={a_value!r} contradicts {b}={b_value!r} ({why}); set only one of them", (a, b), False)


def _ignored(name: str, value: object, by: str, fix: str | None = None) -> str:
    return f"{name}={value!r} is ignored by {by}; {fix or f'unset {name}'}"


def _ignored_error(name: str, value: object, by: str, fix: str | None = None) -> AxisFieldError:
    return AxisFieldError(_ignored(name, value, by, fix), (name,), True)


def _check_choice(name: str, value: object, choices) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{name}={value!r} is unknown; choose one of {list(choices)}")


def _resolve_advantage(cfg, preset: str | None, scale: str | None) -> str | None:
    """The advantage estimator from `advantage_type`, the courses' preset, `use_std_normalization`, `scale_rewards`."""
    chosen, std = cfg.advantage_type, cfg.use_std_normalization
    from_std = None if std is None else ("group_mean_std" if std else "group_mean")
    from_scale = None if scale is None else TRL_SCALE_REWARDS[scale]
    if cfg.multi_objective_aggregation == "normalize_then_sum":
        why = "multi_objective_aggregation='normalize_then_sum' (it normalises each reward function itself, GDPO)"
        for name in ("advantage_type", "use_std_normalization"):
            if getattr(cfg, name) is not None:
                raise _ignored_error(name, getattr(cfg, name), why)
        if preset == "raw":
            raise _conflict("pg_loss_type", cfg.pg_loss_type, "multi_objective_aggregation", "normalize_then_sum", why)
        return None
    if chosen is not None:
        if preset == "raw" and chosen != "raw":
            raise _conflict("pg_loss_type", cfg.pg_loss_type, "advantage_type", chosen, "no_baseline means A = r")
        if preset == "baseline" and chosen == "raw":
            raise _conflict(
                "pg_loss_type", cfg.pg_loss_type, "advantage_type", chosen, "raw rewards are pg_loss_type=no_baseline"
            )
        if std is not None and chosen not in ("group_mean", "group_mean_std"):
            raise _ignored_error("use_std_normalization", std, f"advantage_type={chosen!r}")
        if from_std is not None and from_std != chosen:
            raise _conflict("use_std_normalization", std, "advantage_type", chosen, f"which means {from_std}")
        if from_scale is not None and from_scale != chosen:
            raise _conflict("scale_rewards", scale, "advantage_type", chosen, f"TRL's {scale!r} is {from_scale}")
        return chosen
    if preset == "raw":
        if std is not None:
            raise _ignored_error("use_std_normalization", std, "raw advantages (pg_loss_type='no_baseline')")
        if scale is not None:
            raise _conflict("scale_rewards", scale, "pg_loss_type", cfg.pg_loss_type, "no_baseline means A = r")
        return "raw"
    if from_std is not None and from_scale is not None and from_std != from_scale:
        raise _conflict("use_std_normalization", std, "scale_rewards", scale, f"which means {from_std}")
    return from_std or from_scale or TRL_SCALE_REWARDS["group"]


def _resolve_loss_fields(
    cfg, pg: str, ours: bool, ignored: list[tuple[str, str]]
) -> tuple[float | None, float | None, str]:
    """`epsilon`, `epsilon_high`, `importance_sampling_level` for the loss `pg`; explicit unused ones -> `ignored`."""
    used = set(PG_LOSSES.parameters(pg)) & set(LOSS_FIELDS)
    if cfg.beta != 0.0 and cfg.use_bias_correction_kl:
        used.add("importance_sampling_level")  # the KL's importance ratio is taken at this level
    level = cfg.importance_sampling_level
    if pg in SEQUENCE_LEVEL_LOSSES:
        if level not in (None, "sequence"):
            raise _conflict("importance_sampling_level", level, "pg_loss_type", pg, f"{pg}'s ratio is per sequence")
        used.add("importance_sampling_level")
        level = "sequence"
    if pg == "cispo" and not ours and cfg.epsilon_high is None:
        used.add("epsilon")  # TRL's cispo caps the ratio at epsilon when epsilon_high is unset
    for name in LOSS_FIELDS:
        if getattr(cfg, name) is not None and name not in used:
            ignored.append((name, _ignored(name, getattr(cfg, name), f"pg_loss_type={pg!r}")))
    epsilon = cfg.epsilon if cfg.epsilon is not None else (TRL_EPSILON if "epsilon" in used else None)
    epsilon_high = cfg.epsilon_high
    if "epsilon_high" in used and epsilon_high is None:
        if pg == "cispo" and ours:
            raise ValueError(
                "pg_loss_type='cispo' needs epsilon_high, the cap on its importance ratio (ScaleRL's eps_max: 5.0)"
            )
        epsilon_high = epsilon if epsilon is not None else TRL_EPSILON  # TRL: epsilon_high defaults to epsilon
    return epsilon, epsilon_high, level or "token"


def _trl_loss_type(pg: str, reduction: str, normalize_constant: float | None, max_completion_length) -> str | None:
    pg = "grpo_clip" if pg == "gspo" else pg  # TRL spells GSPO as a clipped loss with importance_sampling_level
    for name, (trl_pg, trl_reduction) in TRL_LOSS_TYPES.items():
        exact = reduction != "masked_normalize" or normalize_constant == max_completion_length
        if (trl_pg, trl_reduction) == (pg, reduction) and exact:
            return name
    return None


def resolve_axes(cfg) -> ResolvedAxes:
    """Resolve the objective axes of `cfg` (an `AblationGRPOConfig` before `GRPOConfig.__post_init__`).

    Raises:
        ValueError: an unknown name, two explicit fields that disagree (naming both), or an explicit field the
            combination ignores (naming the field and the fix).
    """
    scale = SCALE_REWARDS_ALIASES.get(cfg.scale_rewards, cfg.scale_rewards)
    _check_choice("loss_type", cfg.loss_type, TRL_LOSS_TYPES)
    _check_choice("scale_rewards", scale, TRL_SCALE_REWARDS)
    _check_choice("pg_loss_type", cfg.pg_loss_type, PG_LOSS_CHOICES)
    _check_choice("advantage_type", cfg.advantage_type, ADVANTAGE_TYPES)
    _check_choice("length_normalization", cfg.length_normalization, LENGTH_NORMALIZATIONS)
    _check_choice("importance_sampling_level", cfg.importance_sampling_level, ("token", "sequence"))
    _check_choice("multi_objective_aggregation", cfg.multi_objective_aggregation, MULTI_OBJECTIVE_AGGREGATIONS)
    if cfg.advantage_eps is not None and not cfg.advantage_eps >= 0:
        raise ValueError(f"advantage_eps={cfg.advantage_eps} must be >= 0")
    if cfg.normalize_constant is not None and not cfg.normalize_constant > 0:
        raise ValueError(f"normalize_constant={cfg.normalize_constant} must be > 0")

    trl_pg, trl_reduction = TRL_LOSS_TYPES[cfg.loss_type or TRL_DEFAULT_LOSS_TYPE]
    ours = cfg.pg_loss_type is not None
    pg, preset = PG_LOSS_PRESETS.get(cfg.pg_loss_type, (cfg.pg_loss_type, None)) if ours else (trl_pg, None)
    if ours and cfg.loss_type is not None and pg != trl_pg and not (pg == "gspo" and trl_pg == "grpo_clip"):
        why = f"TRL's {cfg.loss_type!r} trains pg_loss_type={trl_pg!r}"
        raise _conflict("pg_loss_type", cfg.pg_loss_type, "loss_type", cfg.loss_type, why)
    reduction = cfg.length_normalization or trl_reduction
    if cfg.length_normalization is not None and cfg.loss_type is not None and reduction != trl_reduction:
        why = f"TRL's {cfg.loss_type!r} reduces with {trl_reduction}"
        raise _conflict("length_normalization", reduction, "loss_type", cfg.loss_type, why)

    advantage = _resolve_advantage(cfg, preset, scale)
    uses_eps = advantage is None or "advantage_eps" in ADVANTAGES.parameters(advantage)
    if cfg.advantage_eps is not None and not uses_eps:
        raise _ignored_error("advantage_eps", cfg.advantage_eps, f"advantage_type={advantage!r}")
    advantage_eps = cfg.advantage_eps if cfg.advantage_eps is not None else (TRL_ADVANTAGE_EPS if uses_eps else None)

    normalize_constant = cfg.normalize_constant
    if reduction == "masked_normalize":
        normalize_constant = float(normalize_constant or cfg.max_completion_length)
    elif normalize_constant is not None:
        fix = "unset it, or choose length_normalization='masked_normalize'"
        raise _ignored_error("normalize_constant", normalize_constant, f"length_normalization={reduction!r}", fix)

    ignored: list[tuple[str, str]] = []
    epsilon, epsilon_high, level = _resolve_loss_fields(cfg, pg, ours, ignored)
    if ignored and ours:
        raise AxisFieldError(ignored[0][1], (ignored[0][0],), True)
    warnings = [f"{message} (trl.GRPOConfig accepts it; AblationGRPOConfig keeps it)" for _, message in ignored]
    if scale is not None and cfg.multi_objective_aggregation == "normalize_then_sum":
        warnings.append(_ignored("scale_rewards", scale, "multi_objective_aggregation='normalize_then_sum'"))
    loss_type = cfg.loss_type or _trl_loss_type(pg, reduction, normalize_constant, cfg.max_completion_length)
    scale_rewards = scale or {v: k for k, v in TRL_SCALE_REWARDS.items()}.get(advantage)
    return ResolvedAxes(
        advantage_type=advantage,
        pg_loss_type=pg,
        length_normalization=reduction,
        advantage_eps=advantage_eps,
        normalize_constant=normalize_constant,
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        importance_sampling_level=level,
        loss_type=loss_type,
        scale_rewards=scale_rewards,
        warnings=warnings,
    )


def check_off_policy(cfg) -> None:
    """A run that trains on a rollout after the policy moved needs a loss that reads the old log-probs.

    TRL stores old log-probs exactly when `gradient_accumulation_steps % (steps_per_generation * num_iterations)
    != 0` (a rollout feeds more than one optimizer step); `cfg` is resolved (after `GRPOConfig.__post_init__`).
    """
    ga, spg, iterations = cfg.gradient_accumulation_steps, cfg.steps_per_generation, cfg.num_iterations
    if ga % (spg * iterations) != 0 and "old_log_probs" not in PG_LOSSES.parameters(cfg.pg_loss_type):
        raise ValueError(
            f"pg_loss_type={cfg.pg_loss_type!r} ignores the old log-probs, but this run trains off-policy: each "
            f"rollout feeds num_iterations * steps_per_generation = {iterations} * {spg} micro-batches, more than "
            f"one optimizer step of gradient_accumulation_steps={ga} (epochs_per_rollout_batch > 1 or "
            "train_batch_size < rollout_batch_size); choose a ratio loss (grpo_clip, grpo_no_clip, ...) or train "
            "on-policy"
        )


def check_skip_zero_advantage(cfg) -> None:
    """`skip_zero_advantage_completions` is exact only when an A = 0 completion adds exactly 0 to the loss."""
    if not cfg.skip_zero_advantage_completions:
        return
    breakers = {
        "beta": (cfg.beta != 0.0, "the KL term of an A = 0 completion is not 0"),
        "entropy_coef": (cfg.entropy_coef != 0.0 or cfg.use_adaptive_entropy, "the entropy bonus counts its tokens"),
        "top_entropy_quantile": (cfg.top_entropy_quantile < 1.0, "the entropy quantile is taken over every token"),
    }
    for name, (bad, why) in breakers.items():
        if bad:
            raise ValueError(
                f"skip_zero_advantage_completions=True contradicts {name}={getattr(cfg, name)!r} ({why}, so leaving "
                "those completions out would change the loss); set only one of them"
            )
