"""The figures of trl_ext's reports: matplotlib on its file-only backend, and a figure written and let go in one place.

`trl-ext plot` (`trl_ext.reporting.plot`), the study report (`trl_ext.study.report`) and the demo's report
(`trl_ext.demo.report`) draw with these. matplotlib loads on the first figure, never on import.
"""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (PNG files, no display, the same on a server as on a laptop)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: str | Path, dpi: int, close: bool = True) -> Path:
    """Write `fig` to `path` (its folder made), then close it (`close`: pyplot keeps every open figure otherwise).

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    if close:
        pyplot().close(fig)
    return path
