"""What the figure modules share: paths, deterministic JSON, the tabular runs, matplotlib, the runner."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from seeupo.validation import InputError, dumps

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path("figures")
DPI = 100

#: Colours of the verdict vocabulary (seeupo/experiments/verdicts.py), shared by the figures.
GOOD, MEH, BAD, NONE = "#4caf50", "#ffd54f", "#e53935", "#bdbdbd"
PRESET_COLORS = {
    "ppo": "#1f77b4", "grpo": "#ff7f0e", "reinforce_pp": "#8c564b", "rloo": "#9467bd", "gspo": "#2ca02c",
    "seeupo": "#d62728", "seeupo_forward": "#e377c2", "seeupo_random": "#7f7f7f",
}


def paper_repro(*parts: str) -> Path:
    """A path under ``paper_repro/``: the working directory's if it exists, else the repository's."""
    local = Path("paper_repro", *parts)
    return local if local.exists() else REPO.joinpath("paper_repro", *parts)


def rel(path: Path) -> str:
    """``path`` relative to the repository (for the records), else as given."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def rounded(value: Any, digits: int = 9) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits (small, stable data files)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def write_json(data: dict[str, Any], path: Path) -> None:
    path.write_text(dumps(rounded(data), indent=1) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 8, "axes.titlesize": 9, "legend.fontsize": 7, "figure.dpi": DPI})
    return plt


def save(fig, path: str | Path) -> None:
    """Save ``fig`` as a small PNG: rendered at :data:`DPI`, then reduced to a 128-colour palette."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png")
    plt.close(fig)
    image = Image.open(buf).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    image.save(path, format="png", optimize=True)


# ------------------------------------------------------------------ tabular runs


def j_history(problem, cfg, run_cfg) -> dict[str, Any]:
    """Exact ``J`` per iteration (``[iterations + 1][instances]``) and ``J*`` per instance of one run."""
    import torch

    from seeupo.tabular.train import run

    torch.set_num_threads(1)
    hist = run(problem, cfg, run_cfg)
    return {"J": hist.J.tolist(), "J_star": hist.J_star.tolist()}


def mean_curve(J: list[list[float]]) -> list[float]:
    return [sum(row) / len(row) for row in J]


def decreases(J: list[list[float]], tol: float = 1e-7) -> int:
    return sum(1 for a, b in zip(J, J[1:]) for x, y in zip(a, b) if x - y > tol)


# ------------------------------------------------------------------ the runner


def regenerate(names: Iterable[str], *, quick: bool = False, out: Path = DEFAULT_OUT, plot_only: bool = False,
               seed: int = 0, log: Callable[[str], None] = print) -> list[Path]:
    """Compute (unless ``plot_only``) and plot each figure into ``out``; one progress line per figure."""
    from seeupo.figures import module

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        mod = module(name)
        start = time.perf_counter()
        json_path, png_path = out / f"{name}.json", out / f"{name}.png"
        if plot_only:
            if not json_path.exists():
                raise InputError(None, f"--plot-only: {json_path} does not exist; run without --plot-only first")
            data = read_json(json_path)
        else:
            data = mod.compute(quick=quick, seed=seed)
            write_json(data, json_path)
            data = read_json(json_path)  # plot exactly what is recorded
        mod.plot(data, png_path)
        written += [json_path, png_path]
        note = f" ({data['note']})" if data.get("note") else ""
        log(f"{name:24s} {time.perf_counter() - start:6.1f} s  {png_path}{note}")
    return written


def module_main(name: str, argv: list[str] | None = None) -> int:
    """``python -m seeupo.figures.<name>``: regenerate that one figure."""
    p = argparse.ArgumentParser(prog=f"python -m seeupo.figures.{name}", description=f"Regenerate figures/{name}.png and its data.")
    p.add_argument("--quick", action="store_true", help="small budgets (seconds)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default: figures)")
    p.add_argument("--plot-only", action="store_true", help="redraw from the recorded data file")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        regenerate([name], quick=args.quick, out=Path(args.out), plot_only=args.plot_only, seed=args.seed)
    except InputError as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    return 0
