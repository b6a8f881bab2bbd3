"""`trl-ext discover`: the Typer command around `trl_ext.discover.loop.run_discovery`."""

from __future__ import annotations

import os
from pathlib import Path

import typer

# DiscoveryConfig's field names in its errors, as the options that set them.
_OPTIONS = {
    "samples": "--samples",
    "rounds": "--rounds",
    "temperature": "--temperature",
    "dimension": "--dimension",
    "workers": "--workers",
    "system_prompt": "--system-prompt",
    "task_prompt": "--prompt-file",
    "history_window": "--history-window",
    "max_tokens": "--max-tokens",
    "time_limit_s": "--time-limit",
}


def _option_names(message: str) -> str:
    field = message.split(" ", 1)[0]
    return message.replace(field, _OPTIONS[field], 1) if field in _OPTIONS else message


def _read_text_option(option: str, path: Path, if_empty: str = "") -> str:
    """The text of the file an option names; a clear error naming the option when it is missing, unreadable, not
    UTF-8 or blank."""
    if not path.is_file():
        raise typer.BadParameter(f"{option} {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise typer.BadParameter(f"{option} {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise typer.BadParameter(f"{option} {path}: cannot read it ({err.strerror})") from None
    if not text.strip():
        raise typer.BadParameter(f"{option} {path}: the file is empty{if_empty}")
    return text


def register(app: typer.Typer) -> None:
    """Add `trl-ext discover` to the CLI."""

    @app.command("discover")
    def discover_command(
        base_url: str | None = typer.Option(
            None, help="OpenAI-compatible API root, e.g. http://localhost:8000/v1 (a `trl-ext launch` vLLM server)."
        ),
        model: str | None = typer.Option(
            None, help="Served model name with --base-url (default: the first of /models); with --local, a directory."
        ),
        local: bool = typer.Option(False, "--local", help="Run --model locally with transformers instead of HTTP."),
        api_key: str | None = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer token for --base-url."),
        samples: int = typer.Option(4, "--samples", "-n", help="Programs sampled per round (Best@N)."),
        rounds: int = typer.Option(3, help="Rounds; each later round feeds the verifier's message back."),
        temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
        max_tokens: int = typer.Option(4096, help="Tokens per reply."),
        seed: int = typer.Option(0, help="Sampling seed."),
        time_limit: float = typer.Option(10.0, help="Sandbox seconds per program."),
        dimension: int = typer.Option(11, help="Dimension of the vectors."),
        workers: int = typer.Option(4, help="Programs checked at once."),
        prompt_file: Path | None = typer.Option(None, help="Replace the task prompt with this file's text."),
        system_prompt: str | None = typer.Option(
            None, help='The system message (default: trl_ext.discover.SYSTEM_PROMPT; "" sends none).'
        ),
        system_prompt_file: Path | None = typer.Option(None, help="Read the system message from this file."),
        history_window: int | None = typer.Option(
            None,
            help="Exchanges (a round's chosen reply and the verifier's feedback) each refinement request carries "
            "after the task prompt: the last K (default: all, the whole conversation; 1: the previous round's only).",
        ),
        dtype: str = typer.Option("float32", help="Parameter dtype with --local."),
        output_dir: str = typer.Option("discover_out", help="Where program.py, conversation_log.json, report.md go."),
    ) -> None:
        """Verifier-guided discovery of kissing configurations: Best@N and iterative refinement."""
        from trl_ext.discover.backends import BackendError, OpenAIChatBackend, TransformersChatBackend
        from trl_ext.discover.loop import DiscoveryConfig, run_discovery

        if (base_url is None) == (not local):
            raise typer.BadParameter("give exactly one of --base-url URL or --local --model DIR")
        if local and not model:
            raise typer.BadParameter("--local needs --model (a model directory)")
        if local and not Path(model).is_dir() and os.environ.get("HF_HUB_OFFLINE") == "1":
            raise typer.BadParameter(f"--model {model}: no such directory (and the hub is offline)")
        task_prompt = _read_text_option("--prompt-file", prompt_file) if prompt_file is not None else None
        if system_prompt is not None and system_prompt_file is not None:
            raise typer.BadParameter("give one of --system-prompt TEXT or --system-prompt-file FILE, not both")
        if system_prompt_file is not None:
            hint = " (--system-prompt '' sends no system message)"
            system_prompt = _read_text_option("--system-prompt-file", system_prompt_file, hint)
        try:
            cfg = DiscoveryConfig(
                samples=samples,
                rounds=rounds,
                temperature=temperature,
                max_tokens=max_tokens,
                seed=seed,
                time_limit_s=time_limit,
                dimension=dimension,
                output_dir=output_dir,
                workers=workers,
                task_prompt=task_prompt,
                history_window=history_window,
                **({} if system_prompt is None else {"system_prompt": system_prompt}),
            )
        except ValueError as err:
            raise typer.BadParameter(_option_names(str(err))) from None
        try:
            if local:
                backend = TransformersChatBackend(model, dtype=dtype)
            else:
                backend = OpenAIChatBackend(base_url, model, api_key=api_key)
            result = run_discovery(backend, cfg, progress=lambda line: typer.echo(line, err=True))
        except (BackendError, ValueError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"best |C| = {result['best_score']}; history {result['history']}; output in {output_dir}")
