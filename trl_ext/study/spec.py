"""The study file: arms (a recipe YAML plus overrides in the recipe CLI's spelling) x seeds, a reference arm, the
metrics to compare. Pure: reads YAML, checks every field, names the file and field of a mistake.

    name: gsm8k_qwen3_0.6b_ablations
    script: recipes/gsm8k.py                      # default: recipes/<the first arm's YAML folder>.py
    accelerate_config: accelerate_configs/vllm_server_gpu0_train_gpu1.yaml
    seeds: [0, 1, 2]
    reference: r1_zero                            # default: the first arm
    metrics: ["eval_rewards/*/answer_reward"]     # default: the recipe's validation accuracy
    claims: [...]                                 # published claims judged by the report (trl_ext.study.claims)
    args: --n_grpo_steps 400                      # overrides every arm gets, before the arm's own args
    arms:
      r1_zero: {recipe: recipes/gsm8k/r1_zero.yaml}
      lr_3e-5: {recipe: recipes/gsm8k/r1_zero.yaml, args: --learning_rate 3e-5}

Paths are relative to the folder the command runs in (the repository root, as for `trl-ext launch`). Run `k` of arm
`a` writes to `runs/<name>/<a>/seed<k>/` (`--output_dir`), with `--seed k` and `--resume true` after the arm's args.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trl_ext.recipes.arguments import recipe_script
from trl_ext.study.claims import Claim, parse_claims

#: The recipes' validation accuracy (the answer reward without the format bonus), as `trl-ext plot` draws it.
DEFAULT_METRICS = ("eval_rewards/*/answer_reward",)
RUNS_ROOT = Path("runs")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_KEYS = {
    "name", "description", "script", "accelerate_config", "seeds", "reference", "metrics", "arms", "launch_args",
    "cores_per_run", "slurm", "claims", "args",
}  # fmt: skip
_ARM_KEYS = {"recipe", "args", "script", "accelerate_config", "launch_args"}
#: The arguments the study sets on every run itself.
_RESERVED = ("--output_dir", "--seed", "--resume", "--resume_from_checkpoint")
SLURM_KEYS = {"partition", "account", "time", "gpus_per_node", "cpus_per_task", "mem", "qos", "extra", "warning_s"}


class StudyError(ValueError):
    """A study file that cannot run: the message names the file, the field and what to write instead."""


@dataclass(frozen=True)
class Arm:
    """One arm: `script --config recipe args...` launched with `accelerate_config` and `launch_args`."""

    name: str
    recipe: Path
    script: Path
    accelerate_config: Path
    args: tuple[str, ...] = ()
    launch_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Run:
    """One arm at one seed, and the folder it writes to."""

    arm: Arm
    seed: int
    output_dir: Path

    @property
    def name(self) -> str:
        return f"{self.arm.name}/seed{self.seed}"

    def recipe_args(self) -> list[str]:
        """The recipe's arguments: the arm's overrides, then the study's own (folder, seed, resume)."""
        return [
            "--config", str(self.arm.recipe), *self.arm.args,
            "--output_dir", str(self.output_dir), "--seed", str(self.seed), "--resume", "true",
        ]  # fmt: skip


@dataclass(frozen=True)
class Study:
    path: Path
    name: str
    arms: tuple[Arm, ...]
    seeds: tuple[int, ...]
    reference: str
    metrics: tuple[str, ...] = DEFAULT_METRICS
    cores_per_run: int = 1
    slurm: dict = field(default_factory=dict)
    description: str = ""
    root: Path = RUNS_ROOT
    claims: tuple[Claim, ...] = ()

    @property
    def folder(self) -> Path:
        return self.root / self.name

    @property
    def report_dir(self) -> Path:
        return self.folder / "report"

    def runs(self) -> list[Run]:
        """Every run, seed-major (seed 0 of every arm first), so that a study stopped early has whole seeds."""
        return [Run(arm, seed, self.folder / arm.name / f"seed{seed}") for seed in self.seeds for arm in self.arms]

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)


def _args(value, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    raise StudyError(f"{where}: give a string (`--learning_rate 3e-5`) or a list of strings, not {value!r}")


def _file(value, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise StudyError(f"{where}: give a file path, not {value!r}")
    path = Path(value)
    if not path.is_file():
        raise StudyError(f"{where}: {value} not found (paths are relative to the folder you run from)")
    return path


def default_script(recipe: Path) -> Path:
    """The entry point beside the folder of `recipes/<folder>/<x>.yaml` (`recipes/<folder>.py`; `recipes/math_grpo.py`
    for `recipes/math/`: `trl_ext.recipes.recipe_script`)."""
    return recipe.parent.parent / recipe_script(recipe.parent.name)


def load_study(path: str | Path, root: str | Path = RUNS_ROOT) -> Study:
    """Reads and checks a study file.

    Raises:
        StudyError: a missing or unknown field, a bad value, a file that does not exist (the message names it).
    """
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"study file {path} not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise StudyError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise StudyError(f"{path}: a study file is a mapping (name, arms, seeds, ...)")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise StudyError(f"{path}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not _NAME.match(name):
        raise StudyError(f"{path}: name {name!r} must be letters, digits, `_`, `-`, `.` (it names runs/<name>/)")
    seeds = data.get("seeds")
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    ):
        raise StudyError(f"{path}: seeds must be a non-empty list of integers >= 0, e.g. [0, 1, 2]; got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise StudyError(f"{path}: seeds {seeds} repeat a seed")
    arms_data = data.get("arms")
    if not isinstance(arms_data, dict) or not arms_data:
        raise StudyError(f"{path}: arms must be a mapping of arm name -> {{recipe: YAML, args: ...}}")
    default_config = data.get("accelerate_config")
    study_launch = _args(data.get("launch_args"), f"{path}: launch_args")
    study_args = _args(data.get("args"), f"{path}: args")
    arms = []
    for arm_name, arm in arms_data.items():
        where = f"{path}: arms.{arm_name}"
        if not isinstance(arm_name, str) or not _NAME.match(arm_name):
            raise StudyError(f"{where}: an arm name is letters, digits, `_`, `-`, `.` (it names a folder)")
        if isinstance(arm, str):
            arm = {"recipe": arm}
        if not isinstance(arm, dict):
            raise StudyError(f"{where}: give {{recipe: YAML, args: '--flag value'}}")
        bad = sorted(set(arm) - _ARM_KEYS)
        if bad:
            raise StudyError(f"{where}: unknown field(s) {', '.join(bad)} (known: {', '.join(sorted(_ARM_KEYS))})")
        recipe = _file(arm.get("recipe"), f"{where}.recipe")
        args = study_args + _args(arm.get("args"), f"{where}.args")
        for flag in args:
            if flag.split("=")[0] in _RESERVED:
                field_name = f"{path}: args" if flag in study_args else f"{where}.args"
                raise StudyError(f"{field_name}: {flag.split('=')[0]} is set by the study for every run; remove it")
        script_value = arm.get("script", data.get("script"))
        script = _file(script_value, f"{where}.script") if script_value else default_script(recipe)
        if not script.is_file():
            raise StudyError(f"{where}: no recipe script {script} beside {recipe}; set `script:`")
        config = arm.get("accelerate_config", default_config)
        if config is None:
            raise StudyError(f"{where}: no accelerate_config (set it for the study or the arm)")
        accelerate_config = _file(config, f"{where}.accelerate_config")
        launch_args = study_launch + _args(arm.get("launch_args"), f"{where}.launch_args")
        arms.append(Arm(arm_name, recipe, script, accelerate_config, args, launch_args))
    reference = data.get("reference", arms[0].name)
    if reference not in {a.name for a in arms}:
        raise StudyError(f"{path}: reference {reference!r} is not an arm ({', '.join(a.name for a in arms)})")
    metrics = data.get("metrics", list(DEFAULT_METRICS))
    if isinstance(metrics, str):
        metrics = [metrics]
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
        raise StudyError(f"{path}: metrics must be a list of logged keys (wildcards allowed); got {metrics!r}")
    cores = data.get("cores_per_run", 1)
    if not isinstance(cores, int) or cores < 1:
        raise StudyError(f"{path}: cores_per_run must be an integer >= 1, got {cores!r}")
    slurm = data.get("slurm") or {}
    if not isinstance(slurm, dict) or set(slurm) - SLURM_KEYS:
        raise StudyError(f"{path}: slurm is a mapping of {', '.join(sorted(SLURM_KEYS))}; got {slurm!r}")
    for key in ("gpus_per_node", "cpus_per_task", "warning_s"):
        value = slurm.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
            raise StudyError(f"{path}: slurm.{key} must be a whole number >= 1, got {value!r}")
    try:
        claims = parse_claims(data.get("claims"), str(path), [a.name for a in arms], list(metrics))
    except ValueError as exc:
        raise StudyError(str(exc)) from None
    return Study(
        path=path,
        name=name,
        arms=tuple(arms),
        seeds=tuple(seeds),
        reference=reference,
        metrics=tuple(metrics),
        cores_per_run=cores,
        slurm=dict(slurm),
        description=str(data.get("description", "")),
        root=Path(root),
        claims=claims,
    )
