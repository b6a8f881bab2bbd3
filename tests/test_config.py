"""AblationGRPOConfig: the seeds' batch vocabulary mapped onto TRL, derived TRL loss fields, and errors that name
the field, all at construction time (no model involved)."""

from __future__ import annotations

import pytest

from trl_ext import AblationGRPOConfig
from trl_ext.objectives import LENGTH_NORMALIZATIONS, PG_LOSS_TYPES

BASE = dict(report_to="none", use_cpu=True, save_strategy="no")


def make(tmp_path, **kwargs) -> AblationGRPOConfig:
    return AblationGRPOConfig(output_dir=str(tmp_path), **BASE, **kwargs)


def test_seed_batch_vocabulary_maps_onto_trl(tmp_path):
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
    assert cfg.train_batch_size == 8  # the seed value is kept as given


def test_cs336_consistent_set_is_on_policy(tmp_path):
    # HW3 / CS336 A5: rollout 256 = train 256, 128 accumulation steps of micro-batch 2, group 8.
    cfg = make(tmp_path, group_size=8, rollout_batch_size=256, train_batch_size=256, gradient_accumulation_steps=128)
    assert cfg.per_device_train_batch_size == 2
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps == 128  # design.md: on-policy
    assert cfg.num_iterations == 1


def test_train_batch_size_divides_by_world_size(tmp_path, monkeypatch):
    import trl_ext.config

    # Only the world size the config reads is replaced; launching real processes is test_trainer_distributed's job.
    monkeypatch.setattr(trl_ext.config, "_world_size", lambda: 2)
    cfg = make(tmp_path, group_size=4, train_batch_size=16, rollout_batch_size=16, gradient_accumulation_steps=2)
    assert cfg.per_device_train_batch_size == 4  # 16 / (2 accumulation steps x 2 processes)
    with pytest.raises(ValueError, match="train_batch_size=6 must be divisible by gradient_accumulation_steps"):
        make(tmp_path, group_size=2, train_batch_size=6, gradient_accumulation_steps=2)


def test_trl_fields_left_alone_without_seed_fields(tmp_path):
    cfg = make(tmp_path, num_generations=4, per_device_train_batch_size=8)
    assert (cfg.num_generations, cfg.generation_batch_size, cfg.steps_per_generation) == (4, 8, 1)


@pytest.mark.parametrize(
    ("std", "length_normalization", "loss_type", "scale_rewards"),
    [
        (True, "masked_mean", "grpo", "group"),
        (False, "masked_mean", "grpo", "none"),
        (True, "masked_normalize", "dr_grpo", "group"),
        (False, "masked_normalize", "dr_grpo", "none"),
    ],
)
def test_trl_loss_fields_are_derived(tmp_path, std, length_normalization, loss_type, scale_rewards):
    cfg = make(tmp_path, use_std_normalization=std, length_normalization=length_normalization)
    assert (cfg.loss_type, cfg.scale_rewards) == (loss_type, scale_rewards)


def test_consistent_explicit_trl_loss_fields_are_accepted(tmp_path):
    cfg = make(
        tmp_path,
        use_std_normalization=False,
        scale_rewards=False,  # TRL's boolean spelling of "none"
        length_normalization="masked_normalize",
        loss_type="dr_grpo",
    )
    assert (cfg.loss_type, cfg.scale_rewards) == ("dr_grpo", "none")


def test_defaults(tmp_path):
    cfg = make(tmp_path, max_completion_length=96)
    assert cfg.pg_loss_type == "grpo_clip" and cfg.length_normalization == "masked_mean"
    assert cfg.use_std_normalization is True and cfg.advantage_eps == 1e-6
    assert cfg.normalize_constant == 96.0  # max_completion_length
    assert make(tmp_path, normalize_constant=10).normalize_constant == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # The seeds' sanity checks; the first row is seed 001's inconsistent example (design.md).
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
        # Unknown axis values.
        (dict(pg_loss_type="ppo"), "pg_loss_type='ppo' is unknown"),
        (dict(length_normalization="sum"), "length_normalization='sum' is unknown"),
        (dict(advantage_eps=-1.0), "advantage_eps=-1.0 must be >= 0"),
        (dict(normalize_constant=0), "normalize_constant=0 must be > 0"),
        # A seed field contradicting an explicitly set TRL field.
        (dict(group_size=4, num_generations=6), "group_size=4 implies num_generations=4, but num_generations=6"),
        (dict(epochs_per_rollout_batch=2, num_iterations=3), "implies num_iterations=2, but num_iterations=3"),
        (
            dict(group_size=4, train_batch_size=8, per_device_train_batch_size=2),
            "implies per_device_train_batch_size=8, but per_device_train_batch_size=2",
        ),
        (
            dict(group_size=4, rollout_batch_size=16, generation_batch_size=32),
            "implies generation_batch_size=16, but generation_batch_size=32",
        ),
        (
            dict(group_size=4, rollout_batch_size=16, steps_per_generation=3),
            "rollout_batch_size=16 contradicts steps_per_generation=3",
        ),
        # TRL's own loss fields contradicting ours.
        (dict(loss_type="bnpo"), "loss_type='bnpo' contradicts length_normalization='masked_mean'"),
        (dict(length_normalization="masked_normalize", loss_type="grpo"), "loss_type='grpo' contradicts"),
        (dict(scale_rewards="batch"), "scale_rewards='batch' contradicts use_std_normalization=True"),
        (dict(use_std_normalization=True, scale_rewards="none"), "scale_rewards='none' contradicts"),
        # TRL features the ablation axes do not model.
        (dict(beta=0.04), "beta=0.04 is not supported"),
        (dict(top_entropy_quantile=0.2), "top_entropy_quantile=0.2 is not supported"),
        (dict(importance_sampling_level="sequence"), "importance_sampling_level='sequence' is not supported"),
        (dict(entropy_coef=0.01), "entropy_coef=0.01 is not supported"),
        (dict(off_policy_mask_threshold=0.5), "off_policy_mask_threshold=0.5 is not supported"),
        (dict(delta=2.0), "delta=2.0 is not supported"),
        (dict(multi_objective_aggregation="normalize_then_sum"), "multi_objective_aggregation='normalize_then_sum'"),
    ],
)
def test_bad_config_fails_at_construction_naming_the_field(tmp_path, kwargs, message):
    with pytest.raises(ValueError) as excinfo:
        make(tmp_path, **kwargs)
    assert message in str(excinfo.value)


def test_choices_come_from_the_registries_and_show_in_trlparser_help(tmp_path):
    from trl import TrlParser

    parser = TrlParser((AblationGRPOConfig,))
    text = " ".join(parser.format_help().split())  # argparse wraps lines
    for name in [*PG_LOSS_TYPES, *LENGTH_NORMALIZATIONS]:
        assert name in text
    for flag in ["--pg_loss_type", "--use_std_normalization", "--advantage_eps", "--length_normalization",
                 "--normalize_constant", "--group_size", "--rollout_batch_size", "--train_batch_size",
                 "--epochs_per_rollout_batch"]:  # fmt: skip
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
    assert (cfg.pg_loss_type, cfg.loss_type, cfg.scale_rewards) == ("grpo_no_clip", "dr_grpo", "none")
    assert (cfg.num_generations, cfg.per_device_train_batch_size, cfg.steps_per_generation) == (2, 4, 4)
    with pytest.raises(SystemExit):  # argparse rejects a value outside the registry's choices
        TrlParser((AblationGRPOConfig,)).parse_args_and_config(["--output_dir", str(tmp_path), "--pg_loss_type", "x"])


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

    import trl_ext.config
    from trl_ext import AblationGRPOTrainer

    monkeypatch.setattr(trl_ext.config, "_world_size", lambda: 2)  # as if WORLD_SIZE=2 when the config was built
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
