"""What the figure modules share: paths, deterministic JSON, the tabular runs, matplotlib, the runner."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from seeupo.validation.errors import InputError
from seeupo.validation.files import dumps

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


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def regenerate(names: Iterable[str], *, quick: bool = False, out: Path = DEFAULT_OUT, plot_only: bool = False,
               seed: int = 0, runs: list[str] | None = None, log: Callable[[str], None] = print,
               say: Callable[[str], None] = _stderr) -> list[Path]:
    """Compute (unless ``plot_only``) and plot each figure into ``out``; one line per figure to ``log``
    when it is written, and one to ``say`` when it starts (a figure may take a minute).

    ``runs``: run folders for ``training_curves`` (its only figure-specific input).
    """
    from seeupo.figures import module

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    names = list(names)
    for k, name in enumerate(names):
        mod = module(name)
        say(f"[{k + 1}/{len(names)}] {name}: {'plotting' if plot_only else 'computing'} ...")
        start = time.perf_counter()
        json_path, png_path = out / f"{name}.json", out / f"{name}.png"
        if plot_only:
            if not json_path.exists():
                raise InputError(None, f"--plot-only: {json_path} does not exist; run without --plot-only first")
            data = read_json(json_path)
        else:
            extra = {"runs": runs, "log": log} if name == "training_curves" else {}
            data = mod.compute(quick=quick, seed=seed, **extra)
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
    if name == "training_curves":
        p.add_argument("--runs", nargs="+", metavar="DIR", help="run folders with metrics.jsonl")
    args = p.parse_args(argv)
    try:
        regenerate([name], quick=args.quick, out=Path(args.out), plot_only=args.plot_only, seed=args.seed,
                   runs=getattr(args, "runs", None))
    except InputError as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


# ------------------------------------------------------------------ variant ablations (normalisation, M)


def variant_runs(problem, variants: dict[str, dict[str, Any]], modes: dict[str, dict[str, Any]], seed: int,
                 base: str = "seeupo") -> dict[str, Any]:
    """``base`` with each variant's overrides, in each mode: mean ``J`` curve, ``J`` decreases and final gaps.

    ``modes`` maps a mode name (``exact`` / ``sampled``) to its algorithm overrides plus ``iterations``
    and optionally ``tasks``.
    """
    from seeupo.core.config import preset
    from seeupo.tabular.train import RunConfig

    out: dict[str, Any] = {}
    for mode, settings in modes.items():
        settings = dict(settings)
        iterations, tasks = settings.pop("iterations"), settings.pop("tasks", 4)
        out[mode] = {}
        for label, overrides in variants.items():
            h = j_history(problem, preset(base, **(settings | overrides)),
                          RunConfig(mode=mode, iterations=iterations, tasks=tasks, lr=0.05, seed=seed))
            gaps = [s - j for s, j in zip(h["J_star"], h["J"][-1])]
            drops = [a - b for row_a, row_b in zip(h["J"], h["J"][1:]) for a, b in zip(row_a, row_b)]
            out[mode][label] = {"overrides": overrides, "J_mean": mean_curve(h["J"]), "J_star_mean": sum(h["J_star"]) / len(h["J_star"]),
                                "J_decreases": decreases(h["J"]), "largest_decrease": max([0.0] + drops),
                                "final_gap_mean": sum(gaps) / len(gaps), "final_gap_max": max(gaps)}
    return out


def plot_variants(data: dict[str, Any], path, title: str, colors: dict[str, str]) -> None:
    """Mean ``J`` per iteration of each variant, one panel per mode; the legend gives the final gap and J decreases."""
    plt = pyplot()
    modes = list(data["runs"])
    fig, axes = plt.subplots(1, len(modes), figsize=(4.6 * len(modes), 3.4), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        j_star = None
        for label, r in data["runs"][mode].items():
            dec = f", {r['J_decreases']} J dec. (max {r['largest_decrease']:.1e})" if r["J_decreases"] else ", J never fell"
            ax.plot(r["J_mean"], color=colors.get(label), lw=1.3, label=f"{label}: gap {r['final_gap_mean']:.1e}{dec}")
            j_star = r["J_star_mean"]
        ax.axhline(j_star, color="black", ls=":", lw=1, label="mean J*")
        iters = len(next(iter(data["runs"][mode].values()))["J_mean"]) - 1
        note = " (J decreases are sampling noise)" if mode == "sampled" else ""
        ax.set_title(f"{mode} mode{note}")
        ax.set_xlabel("iteration")
        ax.set_ylabel(f"mean exact J over {data['setting']['instances']} instances")
        ax.set_xlim(0, iters)
        ax.legend(loc="lower right", fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    save(fig, path)
