"""AblationGRPOConfig: the axes resolved from our fields, the courses' presets and TRL's names (TRL's defaults when
nothing is set), errors that name both fields of a conflict or the field a combination ignores, and the courses' batch
vocabulary mapped onto TRL, all at construction time (no model involved)."""

from __future__ import annotations

import pytest

from trl_ext import AblationGRPOConfig
from trl_ext.grpo.axes import PG_LOSS_CHOICES
from trl_ext.objectives import ADVANTAGE_TYPES, LENGTH_NORMALIZATIONS

BASE = dict(report_to="none", use_cpu=True, save_strategy="no")


def make(tmp_path, **kwargs) -> AblationGRPOConfig:
    return AblationGRPOConfig(output_dir=str(tmp_path), **BASE, **kwargs)


def test_course_batch_vocabulary_maps_onto_trl(tmp_path):
    # 16 completions per rollout = 4 prompts x 4; 8 per optimizer step = 4 per micro-batch x 2 accumulation steps;
    # so 2 optimizer steps per rollout, and each rollout is used for 2 epochs.
    cfg = make(
        tmp_path,
        group_size=4,
        rollout_batch_size=16,
        train_batch_size=8,
        gradient_accumulation_steps=2,
        epochs_per_rollout_batch=2,
    )
    assert (cfg.num_generations, cfg.generation_batch_size, cfg.per_device_train_batch_size) == (4, 16, 4)
    assert (cfg.steps_per_generation, cfg.num_iterations) == (4, 2)
    assert cfg.train_batch_size == 8  # the course value is kept as given


def test_cs336_consistent_set_is_on_policy(tmp_path):
    # HW3 / CS336 A5: rollout 256 = train 256, 128 accumulation steps of micro-batch 2, group 8.
    cfg = make(tmp_path, group_size=8, rollout_batch_size=256, train_batch_size=256, gradient_accumulation_steps=128)
    assert cfg.per_device_train_batch_size == 2
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps == 128  # design.md: on-policy
    assert cfg.num_iterations == 1


def test_train_batch_size_divides_by_world_size(tmp_path, monkeypatch):
    import trl_ext.grpo.config

    # Only the world size the config reads is replaced; launching real processes is test_trainer_distributed's job.
    monkeypatch.setattr(trl_ext.grpo.config, "_world_size", lambda: 2)
    cfg = make(tmp_path, group_size=4, train_batch_size=16, rollout_batch_size=16, gradient_accumulation_steps=2)
    assert cfg.per_device_train_batch_size == 4  # 16 / (2 accumulation steps x 2 processes)
    with pytest.raises(ValueError, match="train_batch_size=6 must be divisible by gradient_accumulation_steps"):
        make(tmp_path, group_size=2, train_batch_size=6, gradient_accumulation_steps=2)


def test_trl_fields_left_alone_without_course_fields(tmp_path):
    cfg = make(tmp_path, num_generations=4, per_device_train_batch_size=8)
    assert (cfg.num_generations, cfg.generation_batch_size, cfg.steps_per_generation) == (4, 8, 1)


def axes(cfg) -> tuple:
    return (cfg.advantage_type, cfg.pg_loss_type, cfg.length_normalization)


def test_no_axis_field_set_trains_what_trl_grpoconfig_trains(tmp_path):
    # Bug caught: "unset" meant "equal to TRL's default", so loss_type "dapo" became "grpo" and eps 1e-6.
    cfg = make(tmp_path)
    assert axes(cfg) == ("group_mean_std", "grpo_clip", "token_mean")
    assert (cfg.loss_type, cfg.scale_rewards) == ("dapo", "group")
    assert (cfg.advantage_eps, cfg.epsilon, cfg.epsilon_high, cfg.importance_sampling_level) == (
        1e-4,
        0.2,
        0.2,
        "token",
    )
    assert cfg.normalize_constant is None and cfg.use_std_normalization is None


@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [
        ("grpo", ("grpo_clip", "masked_mean")),
        ("bnpo", ("grpo_clip", "microbatch_token_mean")),
        ("dr_grpo", ("grpo_clip", "masked_normalize")),
        ("dapo", ("grpo_clip", "token_mean")),
        ("cispo", ("cispo", "token_mean")),
        ("sapo", ("sapo", "masked_mean")),
        ("luspo", ("grpo_clip", "seq_mean_token_sum")),
        ("vespo", ("vespo", "token_mean")),
    ],
)
def test_every_trl_loss_type_maps_onto_the_axes(tmp_path, loss_type, expected):
    cfg = make(tmp_path, loss_type=loss_type, max_completion_length=64)
    assert axes(cfg)[1:] == expected and cfg.loss_type == loss_type
    if loss_type == "dr_grpo":
        assert cfg.normalize_constant == 64.0


@pytest.mark.parametrize(
    ("scale_rewards", "advantage_type"),
    [("group", "group_mean_std"), ("none", "group_mean"), ("batch", "batch_std"), (True, "group_mean_std"),
     (False, "group_mean")],
)  # fmt: skip
def test_scale_rewards_maps_onto_the_advantage(tmp_path, scale_rewards, advantage_type):
    cfg = make(tmp_path, scale_rewards=scale_rewards)
    assert cfg.advantage_type == advantage_type
    assert cfg.scale_rewards == {True: "group", False: "none"}.get(scale_rewards, scale_rewards)


def test_the_seeds_presets(tmp_path):
    cfg = make(tmp_path, pg_loss_type="no_baseline", length_normalization="masked_mean")
    assert axes(cfg) == ("raw", "reinforce", "masked_mean")
    assert (cfg.advantage_eps, cfg.epsilon, cfg.loss_type, cfg.scale_rewards) == (None, None, None, None)
    cfg = make(tmp_path, pg_loss_type="reinforce_with_baseline", use_std_normalization=False)
    assert axes(cfg) == ("group_mean", "reinforce", "token_mean")
    cfg = make(tmp_path, pg_loss_type="grpo_clip", use_std_normalization=True, advantage_eps=1e-6,
               length_normalization="masked_mean")  # fmt: skip
    assert axes(cfg) == ("group_mean_std", "grpo_clip", "masked_mean") and cfg.advantage_eps == 1e-6
    assert (cfg.loss_type, cfg.scale_rewards) == ("grpo", "group")  # TRL's names for the same combination


def test_explicit_axis_fields_win_over_trl_defaults(tmp_path):
    cfg = make(tmp_path, advantage_type="rloo", pg_loss_type="cispo", epsilon_high=5.0,
               length_normalization="seq_mean_token_sum")  # fmt: skip
    assert axes(cfg) == ("rloo", "cispo", "seq_mean_token_sum")
    assert (cfg.advantage_eps, cfg.epsilon, cfg.epsilon_high) == (None, None, 5.0)
    assert (cfg.loss_type, cfg.scale_rewards) == (None, None)  # TRL has no name for this one


def test_gspo_and_luspo_are_sequence_level(tmp_path):
    cfg = make(tmp_path, pg_loss_type="gspo", length_normalization="masked_mean")
    assert cfg.importance_sampling_level == "sequence" and cfg.loss_type == "grpo"
    assert make(tmp_path, pg_loss_type="luspo").importance_sampling_level == "sequence"
    cfg = make(tmp_path, loss_type="grpo", importance_sampling_level="sequence")  # TRL's spelling of GSPO
    assert axes(cfg)[1:] == ("grpo_clip", "masked_mean") and cfg.importance_sampling_level == "sequence"


def test_consistent_explicit_trl_and_axis_fields_are_accepted(tmp_path):
    cfg = make(tmp_path, use_std_normalization=False, scale_rewards=False, length_normalization="masked_normalize",
               loss_type="dr_grpo")  # fmt: skip
    assert axes(cfg) == ("group_mean", "grpo_clip", "masked_normalize")


def test_trl_vocabulary_keeps_fields_trl_would_ignore_with_a_warning(tmp_path):
    # The drop-in rule: trl.GRPOConfig(loss_type="sapo", epsilon=0.3) is accepted by TRL, so it is here.
    with pytest.warns(UserWarning, match="epsilon=0.3 is ignored by pg_loss_type='sapo'"):
        cfg = make(tmp_path, loss_type="sapo", epsilon=0.3)
    assert cfg.epsilon == 0.3
    with pytest.warns(UserWarning, match="scale_rewards='batch' is ignored by multi_objective_aggregation"):
        make(tmp_path, scale_rewards="batch", multi_objective_aggregation="normalize_then_sum")
    cfg = make(tmp_path, loss_type="cispo", epsilon=0.5)  # TRL caps cispo's ratio at epsilon without epsilon_high
    assert cfg.epsilon_high == 0.5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # Two explicit fields that disagree: both are named. (Bug caught: scale_rewards silently becoming "none".)
        (dict(scale_rewards="group", use_std_normalization=False), "use_std_normalization=False contradicts "
         "scale_rewards='group'"),
        (dict(advantage_type="rloo", scale_rewards="group"), "scale_rewards='group' contradicts "
         "advantage_type='rloo'"),
        (dict(advantage_type="group_mean", use_std_normalization=True), "use_std_normalization=True contradicts "
         "advantage_type='group_mean'"),
        (dict(pg_loss_type="no_baseline", advantage_type="group_mean"), "pg_loss_type='no_baseline' contradicts "
         "advantage_type='group_mean'"),
        (dict(pg_loss_type="reinforce_with_baseline", advantage_type="raw"), "contradicts advantage_type='raw'"),
        (dict(pg_loss_type="no_baseline", scale_rewards="none"), "scale_rewards='none' contradicts pg_loss_type"),
        (dict(pg_loss_type="sapo", loss_type="grpo"), "pg_loss_type='sapo' contradicts loss_type='grpo'"),
        (dict(pg_loss_type="luspo", loss_type="luspo"), "pg_loss_type='luspo' contradicts loss_type='luspo'"),
        (dict(length_normalization="masked_mean", loss_type="dapo"), "length_normalization='masked_mean' "
         "contradicts loss_type='dapo'"),
        (dict(pg_loss_type="gspo", importance_sampling_level="token"), "importance_sampling_level='token' "
         "contradicts pg_loss_type='gspo'"),
        # A field the combination ignores (our vocabulary): named, with the fix.
        (dict(pg_loss_type="reinforce_with_baseline", epsilon=0.2), "epsilon=0.2 is ignored by "
         "pg_loss_type='reinforce'; unset epsilon"),
        (dict(pg_loss_type="grpo_no_clip", epsilon_high=0.28), "epsilon_high=0.28 is ignored by "
         "pg_loss_type='grpo_no_clip'"),
        (dict(pg_loss_type="sapo", delta=2.0), "delta=2.0 is ignored by pg_loss_type='sapo'"),
        (dict(pg_loss_type="reinforce", importance_sampling_level="sequence"), "importance_sampling_level="
         "'sequence' is ignored by pg_loss_type='reinforce'"),
        (dict(pg_loss_type="no_baseline", use_std_normalization=True), "use_std_normalization=True is ignored by "
         "raw advantages"),
        (dict(pg_loss_type="no_baseline", advantage_eps=1e-6), "advantage_eps=1e-06 is ignored by "
         "advantage_type='raw'"),
        (dict(use_std_normalization=False, advantage_eps=1e-6), "advantage_eps=1e-06 is ignored by "
         "advantage_type='group_mean'"),
        (dict(advantage_type="passk", use_std_normalization=True), "use_std_normalization=True is ignored by "
         "advantage_type='passk'"),
        (dict(normalize_constant=10), "normalize_constant=10 is ignored by length_normalization='token_mean'"),
        (dict(multi_objective_aggregation="normalize_then_sum", advantage_type="rloo"), "advantage_type='rloo' is "
         "ignored by multi_objective_aggregation='normalize_then_sum'"),
        (dict(pg_loss_type="cispo"), "pg_loss_type='cispo' needs epsilon_high"),
        # An off-policy run with a loss that cannot see the sampling policy.
        (dict(pg_loss_type="reinforce_with_baseline", num_iterations=2), "pg_loss_type='reinforce' ignores the "
         "old log-probs, but this run trains off-policy"),
        (dict(pg_loss_type="no_baseline", group_size=4, rollout_batch_size=16, train_batch_size=8),
         "ignores the old log-probs"),
        # What the zero-advantage skip cannot keep exact.
        (dict(skip_zero_advantage_completions=True, beta=0.04), "skip_zero_advantage_completions=True "
         "contradicts beta=0.04"),
        (dict(skip_zero_advantage_completions=True, entropy_coef=0.01), "contradicts entropy_coef=0.01"),
        (dict(skip_zero_advantage_completions=True, top_entropy_quantile=0.2), "contradicts top_entropy_quantile"),
        (dict(pg_loss_type="vespo", use_vllm=True, vllm_importance_sampling_mode="sequence_mask"),
         "pg_loss_type='vespo' folds the vLLM ratio"),
        # Unknown names and bad numbers.
        (dict(pg_loss_type="ppo"), "pg_loss_type='ppo' is unknown"),
        (dict(advantage_type="gae"), "advantage_type='gae' is unknown"),
        (dict(length_normalization="sum"), "length_normalization='sum' is unknown"),
        (dict(loss_type="ppo"), "loss_type='ppo' is unknown"),
        (dict(scale_rewards="std"), "scale_rewards='std' is unknown"),
        (dict(advantage_eps=-1.0), "advantage_eps=-1.0 must be >= 0"),
        (dict(normalize_constant=0), "normalize_constant=0 must be > 0"),
    ],
)  # fmt: skip
def test_axis_errors_name_the_fields(tmp_path, kwargs, message):
    with pytest.raises(ValueError) as excinfo:
        make(tmp_path, **kwargs)
    assert message in str(excinfo.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # The courses' sanity checks; the first row is NYU Assignment 3's inconsistent example (design.md).
        (
            dict(group_size=8, rollout_batch_size=16, train_batch_size=64, gradient_accumulation_steps=128),
            "train_batch_size=64 must be divisible by gradient_accumulation_steps=128",
        ),
        (
            dict(group_size=2, train_batch_size=6, gradient_accumulation_steps=4),
            "train_batch_size=6 must be divisible",
        ),
        (dict(group_size=3, rollout_batch_size=16, train_batch_size=16), "rollout_batch_size=16 must be divisible by"),
        (dict(group_size=8, rollout_batch_size=16, train_batch_size=4), "train_batch_size=4 must be >= group_size=8"),
        (dict(group_size=4, rollout_batch_size=24, train_batch_size=16), "rollout_batch_size=24 must be a multiple"),
        (dict(group_size=0), "group_size=0 must be a positive integer"),
        (dict(epochs_per_rollout_batch=-1), "epochs_per_rollout_batch=-1 must be a positive integer"),
        # A course-vocabulary field contradicting an explicitly set TRL field.
        (dict(group_size=4, num_generations=6), "group_size=4 implies num_generations=4, but num_generations=6"),
        (dict(epochs_per_rollout_batch=2, num_iterations=3), "implies num_iterations=2, but num_iterations=3"),
        (
            dict(group_size=4, train_batch_size=8, per_device_train_batch_size=2),
            "per_device_train_batch_size=2 contradicts train_batch_size=8",
        ),
        (
            dict(group_size=4, rollout_batch_size=16, generation_batch_size=32),
            "implies generation_batch_size=16, but generation_batch_size=32",
        ),
        (
            dict(group_size=4, rollout_batch_size=16, steps_per_generation=3),
            "rollout_batch_size=16 contradicts steps_per_generation=3",
        ),
    ],
)
def test_bad_batch_config_fails_at_construction_naming_the_field(tmp_path, kwargs, message):
    with pytest.raises(ValueError) as excinfo:
        make(tmp_path, **kwargs)
    assert message in str(excinfo.value)


def test_choices_come_from_the_registries_and_show_in_trlparser_help(tmp_path):
    from trl import TrlParser

    parser = TrlParser((AblationGRPOConfig,))
    text = " ".join(parser.format_help().split())  # argparse wraps lines
    for name in [*PG_LOSS_CHOICES, *LENGTH_NORMALIZATIONS, *ADVANTAGE_TYPES]:
        assert name in text
    for flag in ["--advantage_type", "--pg_loss_type", "--use_std_normalization", "--advantage_eps",
                 "--length_normalization", "--normalize_constant", "--group_size", "--rollout_batch_size",
                 "--train_batch_size", "--epochs_per_rollout_batch"]:  # fmt: skip
        assert flag in text
    assert "A = (r - mean) / (std + advantage_eps)" in text


def test_trlparser_reads_cli_and_yaml(tmp_path):
    from trl import TrlParser

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"output_dir: {tmp_path}\nreport_to: none\nuse_cpu: true\npg_loss_type: grpo_no_clip\n"
        "length_normalization: masked_normalize\nuse_std_normalization: false\ngroup_size: 4\n"
        "rollout_batch_size: 16\ntrain_batch_size: 16\ngradient_accumulation_steps: 4\n"
    )
    (cfg,) = TrlParser((AblationGRPOConfig,)).parse_args_and_config(["--config", str(recipe), "--group_size", "2"])
    assert axes(cfg) == ("group_mean", "grpo_no_clip", "masked_normalize")
    assert (cfg.loss_type, cfg.scale_rewards) == (None, "none")  # TRL has no unclipped-ratio loss
    assert (cfg.num_generations, cfg.per_device_train_batch_size, cfg.steps_per_generation) == (2, 4, 4)
    with pytest.raises(SystemExit):  # argparse rejects a value outside the registry's choices
        TrlParser((AblationGRPOConfig,)).parse_args_and_config(["--output_dir", str(tmp_path), "--pg_loss_type", "x"])
    # YAML null is "unset": how a recipe drops a field its base sets (recipes/countdown/no_baseline.yaml)
    recipe.write_text(f"output_dir: {tmp_path}\nuse_cpu: true\npg_loss_type: no_baseline\nadvantage_eps: null\n")
    (cfg,) = TrlParser((AblationGRPOConfig,)).parse_args_and_config(["--config", str(recipe)])
    assert (cfg.advantage_type, cfg.advantage_eps) == ("raw", None)


def test_trainer_refuses_a_plain_grpo_config_before_loading_the_model(tmp_path):
    from trl import GRPOConfig

    from trl_ext import AblationGRPOTrainer

    # The model id does not exist: reaching the model loader would raise OSError, not this TypeError.
    with pytest.raises(TypeError, match="args must be an AblationGRPOConfig"):
        AblationGRPOTrainer("no-such-org/no-such-model", reward_funcs=[], args=GRPOConfig(str(tmp_path), **BASE))
    with pytest.raises(ValueError, match="pg_loss_type='ppo' is unknown"):
        AblationGRPOTrainer("no-such-org/no-such-model", reward_funcs=[], args=make(tmp_path, pg_loss_type="ppo"))


def test_trainer_rechecks_train_batch_size_against_the_real_world_size(
    tmp_path, monkeypatch, tiny_model, char_tokenizer
):
    from datasets import Dataset

    import trl_ext.grpo.config
    from trl_ext import AblationGRPOTrainer

    monkeypatch.setattr(trl_ext.grpo.config, "_world_size", lambda: 2)  # as if WORLD_SIZE=2 when the config was built
    args = make(tmp_path, group_size=4, train_batch_size=16, rollout_batch_size=16)
    assert args.per_device_train_batch_size == 8
    # ... but the trainer runs in 1 process: 8 * 1 * 1 != 16.
    with pytest.raises(ValueError, match="train_batch_size=16 but per_device_train_batch_size"):
        AblationGRPOTrainer(
            tiny_model,
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
            processing_class=char_tokenizer,
        )
