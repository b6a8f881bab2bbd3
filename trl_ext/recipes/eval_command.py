"""`trl-ext eval`: the Typer command around `trl_ext.evaluation.pipeline.evaluate`. It lives with the recipes because
`--recipe` parses one (`trl_ext.recipes.evaluation`); the evaluation library itself knows nothing of recipes."""

from __future__ import annotations

from pathlib import Path

import typer

from trl_ext.evaluation.config import TASK_NAMES, EvalConfig, parse_int_list


def evaluate(cfg: EvalConfig) -> dict:
    """`trl_ext.evaluation.pipeline.evaluate`, the pipeline (and with it torch) imported when a command runs."""
    from trl_ext.evaluation.pipeline import evaluate as run_pipeline

    return run_pipeline(cfg)


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
    ) -> None:
        """Zero-shot evaluation: accuracy, outcome categories, pass@N and Best@N per token budget."""
        # The recipe parser and the pipeline load only when the command runs (`trl-ext --help` pays none of them).
        from trl_ext.evaluation.summary import format_report
        from trl_ext.recipes.evaluation import RECIPE_FIELDS, eval_config_from_recipe

        # Typer ships its own click: compare the parameter source by name.
        given = {name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"}
        try:
            if recipe is None and model is None:
                raise ValueError("give a MODEL, or --recipe to evaluate a recipe's model as it validates")
            # Every option but MODEL and --recipe is the `EvalConfig` field of the same name.
            values = {name: value for name, value in ctx.params.items() if name not in ("model", "recipe")}
            values["max_tokens"] = parse_int_list(max_tokens, "--max-tokens")
            values["ns"] = parse_int_list(ns, "--ns")
            if recipe is not None:
                names = {"data_file", "output_dir", "max_tokens", "backend", "batch_size", "dtype", "limit", "ns"}
                overrides = {name: values[name] for name in given & (names | set(RECIPE_FIELDS))}
                cfg = eval_config_from_recipe(recipe, model, **overrides)
            else:
                cfg = EvalConfig(model=model, **values)
        except (ValueError, FileNotFoundError) as err:
            raise typer.BadParameter(str(err)) from None
        report = evaluate(cfg)
        typer.echo(format_report(report))
        typer.echo(f"wrote {Path(cfg.output_dir) / 'summary.json'}")
