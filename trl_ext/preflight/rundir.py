"""The output_dir a run writes to: fresh, resumed on purpose, or refused (pure, file reads only).

A run records what it was started with in `<output_dir>/trl_ext_run.json`: the recipe file, the fields the user
stated (YAML chain and command-line flags) and the resolved value of every field. A later run into the same folder:

- empty or missing folder: a fresh run;
- a record of another config (a stated field differs): an error naming both configs and the fields, whatever
  `resume` says (`--config lr_3e-5.yaml --learning_rate 1e-4` must not continue the 3e-5 run);
- the same config: an error unless `resume` is set (then the last `checkpoint-N` is continued);
- files but no record: an error unless `resume` is set (a checkpoint folder from elsewhere).

Fields that name or route a run rather than define it (`IGNORED_FIELDS`) may change on resume.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from trl_ext.preflight.problems import Problem
from trl_ext.run_status import STOP_FILE

RUN_RECORD = "trl_ext_run.json"
# Naming, routing and bookkeeping fields, and the batch split that follows from the number of processes.
IGNORED_FIELDS = frozenset(
    {
        "output_dir",
        "run_name",
        "logging_dir",
        "resume",
        "resume_from_checkpoint",
        "report_to",
        "logging_steps",
        "gpu_memory_gb",
        "expected_completion_tokens",
        "vllm_server_host",
        "vllm_server_port",
        "vllm_server_base_url",
        "vllm_group_port",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "steps_per_generation",
        "use_cpu",
        "local_rank",
        "push_to_hub",
        "hub_model_id",
        "hub_token",
    }
)
# `trl-ext launch` writes the vLLM server's log into output_dir before the trainer starts (and checks this folder);
# a study may ask a run to stop (`trl_ext.run_status`) before it wrote anything.
_LAUNCHER_FILES = re.compile(rf"^(vllm_server_\d+\.log|{re.escape(STOP_FILE)})$")


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of a config value (enums by value, paths and unknown objects as strings)."""
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return str(value)


def make_record(recipe: str | None, argv: Iterable[str], stated: Iterable[str], config: Mapping[str, Any]) -> dict:
    """The run record: recipe file, command-line args, stated field names, and every resolved field."""
    return {
        "recipe": None if recipe is None else str(recipe),
        "argv": list(argv),
        "stated": sorted(set(stated)),
        "config": {key: jsonable(value) for key, value in config.items()},
    }


def read_record(output_dir: str | Path) -> dict | None:
    path = Path(output_dir) / RUN_RECORD
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_record(output_dir: str | Path, record: Mapping) -> Path:
    path = Path(output_dir) / RUN_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True))
    return path


def last_checkpoint(output_dir: str | Path) -> Path | None:
    """The `checkpoint-N` folder with the largest N, by `transformers.trainer_utils.get_last_checkpoint` (the rule
    the Trainer resumes by); None when `output_dir` does not exist (transformers raises there)."""
    from transformers.trainer_utils import get_last_checkpoint

    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    found = get_last_checkpoint(str(folder))
    return None if found is None else Path(found)


def config_differences(old: Mapping, new: Mapping) -> dict[str, tuple[Any, Any]]:
    """`{field: (old value, new value)}` over the fields either run stated, `IGNORED_FIELDS` aside."""
    keys = (set(old.get("stated", ())) | set(new.get("stated", ()))) - IGNORED_FIELDS
    old_config, new_config = old.get("config", {}), new.get("config", {})
    return {
        key: (old_config.get(key), new_config.get(key))
        for key in sorted(keys)
        if old_config.get(key) != new_config.get(key)
    }


def _describe(record: Mapping) -> str:
    flags = " ".join(record.get("argv") or [])
    return f"{record.get('recipe') or '(no recipe file)'}" + (f" with `{flags}`" if flags else "")


@dataclass(frozen=True)
class OutputDirPlan:
    """What the run does with its output_dir: `fresh`, or `resume` from `checkpoint` (None: start over there)."""

    action: str
    checkpoint: Path | None = None
    note: str = ""


def plan_output_dir(
    output_dir: str | Path, record: Mapping, resume: bool, resume_from_checkpoint: str | None = None
) -> tuple[OutputDirPlan | None, list[Problem]]:
    """Decide fresh / resume / refuse for `output_dir` (module docstring), before any model loads."""
    folder = Path(output_dir)
    if resume_from_checkpoint:
        if not Path(resume_from_checkpoint).is_dir():
            return None, [Problem("resume_from_checkpoint", f"{resume_from_checkpoint} is not a folder")]
        resume = True
    entries = sorted(p.name for p in folder.iterdir() if not _LAUNCHER_FILES.match(p.name)) if folder.is_dir() else []
    if not entries:
        if resume and not resume_from_checkpoint:
            return OutputDirPlan("fresh", note=f"resume requested but {folder} is empty: starting fresh"), []
        return OutputDirPlan("fresh"), []
    old = read_record(folder)
    new_flags = f" --output_dir {folder}_2"
    if old is not None:
        differences = config_differences(old, record)
        if differences:
            listed = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in differences.items())
            return None, [
                Problem(
                    "output_dir",
                    f"{folder} holds a run of {_describe(old)}, and this is {_describe(record)}, a different config "
                    f"({listed})",
                    f"give this run its own folder ({new_flags.strip()}), or rerun the recorded command to continue "
                    "that run with --resume true",
                )
            ]
    checkpoint = Path(resume_from_checkpoint) if resume_from_checkpoint else last_checkpoint(folder)
    if not resume:
        what = (
            f"a run of this same config ({_describe(old)})" if old is not None else "files but no trl_ext run record"
        )
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        latest = f"; last checkpoint {checkpoint.name}" if checkpoint else ""
        return None, [
            Problem(
                "output_dir",
                f"{folder} is not empty ({shown}): {what}{latest}",
                f"--resume true to continue it, or{new_flags} for a new run",
            )
        ]
    if checkpoint is None:
        return OutputDirPlan("resume", note=f"no checkpoint in {folder} yet: training starts at step 0 there"), []
    note = "" if old is not None else f"{folder} has no run record: its config cannot be compared"
    return OutputDirPlan("resume", checkpoint=checkpoint, note=note), []


def write_run_record(trainer, output_dir: str | Path, record: Mapping | None) -> None:
    """Write the run record once every process has passed its checks (the trainer exists: the process group has
    met), from the main process."""
    if record is not None and trainer.accelerator.is_main_process:
        write_record(output_dir, record)
