"""`trl-ext eval`: the Typer command around `trl_ext.evaluation.pipeline.evaluate` (and `evaluate_pair` with
`--compare`). It lives with the recipes because `--recipe` parses one (`trl_ext.recipes.evaluation`); the evaluation
library itself knows nothing of recipes."""

from __future__ import annotations

from pathlib import Path

import typer

from trl_ext.evaluation.config import TASK_NAMES, EvalConfig, check_model_name, parse_int_list


def evaluate(cfg: EvalConfig) -> dict:
    """`trl_ext.evaluation.pipeline.evaluate`, the pipeline (and with it torch) imported when a command runs."""
    from trl_ext.evaluation.pipeline import evaluate as run_pipeline

    return run_pipeline(cfg)


def evaluate_pair(cfg: EvalConfig, model_b: str) -> dict:
    """`trl_ext.evaluation.pipeline.evaluate_pair`, imported when the command runs."""
    from trl_ext.evaluation.pipeline import evaluate_pair as run_pair

    return run_pair(cfg, model_b)


def format_pair(result: dict) -> str:
    """Both models' report lines, then each budget's four outcomes."""
    from trl_ext.evaluation.summary import format_report

    lines = []
    for role in ("a", "b"):
        model = result[role]["config"]["model"]
        lines += [f"{role.upper()}: {model}", format_report(result[role])]
    for budget, r in result["comparison"]["results"].items():
        c = r["counts"]
        lines.append(
            f"L{budget}: both right {c['both_right']}, both wrong {c['both_wrong']}, only A {c['only_a']}, "
            f"only B {c['only_b']} ({r['num_problems']} problems)"
        )
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add `trl-ext eval` to the CLI."""

    @app.command("eval")
    def eval_command(
        ctx: typer.Context,
        model: str | None = typer.Argument(
            None, help="Hub id or local directory of the model (with --recipe: default the recipe's model)."
        ),
        recipe: Path | None = typer.Option(
            None,
            "--recipe",
            help="A GRPO recipe YAML: evaluate exactly as its training validates (split, prompt, chat template and "
            "enable_thinking, sampling, stop, reward); budget: its max_completion_length unless --max-tokens.",
        ),
        task: str = typer.Option("gsm8k", help=f"One of {', '.join(TASK_NAMES)}."),
        split: str = typer.Option("test", help="Hub split, or a slice of --data-file ('test[:100]')."),
        data_file: str | None = typer.Option(None, help="Local .jsonl / .parquet instead of the Hub dataset."),
        prompt: str | None = typer.Option(
            None, help="r1_zero, question_only, countdown, intellect (default: the task's)."
        ),
        chat: bool = typer.Option(False, help="Wrap prompts in the tokenizer's chat template (instruct models)."),
        max_tokens: str = typer.Option("1024", help="One or several budgets: '256,512,1024'."),
        temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
        top_p: float = typer.Option(1.0, help="Nucleus sampling mass."),
        n: int = typer.Option(1, help="Samples per problem (pass@N / Best@N use N <= n)."),
        seed: int = typer.Option(0, help="Sampling seed."),
        limit: int | None = typer.Option(None, help="Evaluate the first LIMIT problems."),
        output_dir: str = typer.Option("eval_results", help="Output folder."),
        backend: str = typer.Option("auto", help="auto, transformers, vllm."),
        batch_size: int = typer.Option(64, help="Sequences per generate call (transformers backend)."),
        dtype: str = typer.Option(
            "float32", help="Model dtype (transformers, vLLM CPU); vLLM on GPU: float32 = the checkpoint's dtype."
        ),
        reward: str | None = typer.Option(
            None,
            help="countdown, countdown_single_equation, countdown_binary, r1_zero, question_only "
            "(default: from task/prompt).",
        ),
        ns: str = typer.Option("1,4,8,16", help="N values of pass@N / Best@N."),
        compare: str | None = typer.Option(
            None,
            "--compare",
            help="A second model (B), evaluated on the same problems with the same sampling and seed; writes A's and "
            "B's results to OUTPUT_DIR/a and /b and, beside them, comparison.md / .json / .jsonl: the problems where "
            "they differ, side by side, and the counts of both right, both wrong, only A, only B.",
        ),
    ) -> None:
        """Zero-shot evaluation: accuracy, outcome categories, pass@N and Best@N per token budget; with --compare,
        two models on the same problems."""
        # The recipe parser and the pipeline load only when the command runs (`trl-ext --help` pays none of them).
        from trl_ext.evaluation.summary import format_report
        from trl_ext.recipes.evaluation import RECIPE_FIELDS, eval_config_from_recipe, recipe_yaml_task

        # Typer ships its own click: compare the parameter source by name.
        given = {name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"}
        try:
            if recipe is None and model is None:
                raise ValueError("give a MODEL, or --recipe to evaluate a recipe's model as it validates")
            # Every option but MODEL and --recipe is the `EvalConfig` field of the same name.
            values = {name: value for name, value in ctx.params.items() if name not in ("model", "recipe", "compare")}
            values["max_tokens"] = parse_int_list(max_tokens, "--max-tokens")
            values["ns"] = parse_int_list(ns, "--ns")
            if recipe is not None:
                names = {"data_file", "output_dir", "max_tokens", "backend", "batch_size", "dtype", "limit", "ns"}
                overrides = {name: values[name] for name in given & (names | set(RECIPE_FIELDS))}
                if compare is not None and "output_dir" not in given:  # not the recipe's zero-shot folder
                    overrides["output_dir"] = str(Path("runs") / recipe_yaml_task(recipe) / f"{recipe.stem}_compare")
                cfg = eval_config_from_recipe(recipe, model, **overrides)
            else:
                cfg = EvalConfig(model=model, **values)
            if compare is not None:
                check_model_name(cfg.model, "MODEL")
                check_model_name(compare, "--compare")
        except (ValueError, FileNotFoundError) as err:
            raise typer.BadParameter(str(err)) from None
        if compare is not None:
            result = evaluate_pair(cfg, compare)
            typer.echo(format_pair(result))
            typer.echo(f"wrote {Path(cfg.output_dir) / 'comparison.md'} (and comparison.json, comparison.jsonl)")
            return
        report = evaluate(cfg)
        typer.echo(format_report(report))
        typer.echo(f"wrote {Path(cfg.output_dir) / 'summary.json'}")
