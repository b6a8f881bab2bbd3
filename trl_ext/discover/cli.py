"""`trl-ext discover`: the Typer command around `trl_ext.discover.loop.run_discovery`."""

from __future__ import annotations

import os
from pathlib import Path

import typer


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
        if prompt_file is not None and not prompt_file.is_file():
            raise typer.BadParameter(f"--prompt-file {prompt_file}: no such file")
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
                task_prompt=prompt_file.read_text() if prompt_file else None,
            )
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
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
