"""The Fast_p plots of recorded runs: Fast_p^Inst and Fast_p against the speedup threshold p, per
model (mean over prompt variants, in a min–max band) and per task."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ptxgym.bench.runs import NOTHING_RAN, RecordedRun, Spread, by_model
from ptxgym.records.metrics import best_speedup, fast_p_curve

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure, FigureBase


def plot_fast_p(runs: Sequence[RecordedRun], path: Path) -> None:
    """Save :func:`report_figure` as PNG: the per-model curves above the per-task ones."""
    figure = report_figure(runs)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=120)


def report_figure(runs: Sequence[RecordedRun]) -> Figure:
    """:func:`fast_p_model_figure` (top) and :func:`fast_p_figure` (bottom) in one figure."""
    figure = _figure(rows=2)
    subfigures = figure.subfigures(2, 1, squeeze=False)
    _draw_models(subfigures[0, 0], runs)
    _draw_tasks(subfigures[1, 0], runs, title="Per task: prompt variants and trajectories pooled")
    return figure


def fast_p_figure(runs: Sequence[RecordedRun]) -> Figure:
    """Fast_p^Inst and Fast_p against the threshold p, one line per task (variants pooled).

    A dashed vertical line marks each task's best counting speedup. When no turn ran on a GPU,
    each panel says so, since its flat zero lines were not measured.
    """
    figure = _figure(rows=1)
    _draw_tasks(figure, runs)
    return figure


def fast_p_model_figure(runs: Sequence[RecordedRun]) -> Figure:
    """Fast_p^Inst and Fast_p against the threshold p, one line per agent, knowledge level and
    action language: the mean over prompt variants (each pooling its trajectories over all
    tasks), in a shaded band from the lowest to the highest variant."""
    figure = _figure(rows=1)
    _draw_models(figure, runs)
    return figure


def _figure(rows: int) -> Figure:
    # Imported here: matplotlib is slow to import and only the plot needs it. The Agg canvas is
    # used directly, so a caller's pyplot backend is left alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.8 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _thresholds(runs: Sequence[RecordedRun]) -> list[float]:
    """Speedup thresholds p on a log scale from 0.01 to 10, widened to fit every speedup."""
    speedups = [
        record.speedup
        for run in runs
        for record in run.records()
        if record.correct and record.speedup
    ]
    low = min([0.01, *(s / 2 for s in speedups)])
    high = max([10.0, *(s * 2 for s in speedups)])
    steps = 400
    return [low * (high / low) ** (i / (steps - 1)) for i in range(steps)]


_PANELS = (
    (True, r"$\mathrm{Fast}_p^{\mathrm{Inst}}$ (target instructions executed)"),
    (False, r"$\mathrm{Fast}_p$"),
)


def _panels(
    target: FigureBase, runs: Sequence[RecordedRun], thresholds: Sequence[float], lines: int
) -> list[tuple[Axes, bool, Colormap]]:
    """The two panels (Fast_p^Inst left, Fast_p right), styled, and the palette for ``lines``."""
    from matplotlib import colormaps

    axes = target.subplots(1, 2, sharey=True)
    palette = colormaps["tab10" if lines <= 10 else "tab20"]
    for ax, (_, title) in zip(axes, _PANELS, strict=True):
        if not any(run.reached_gpu for run in runs):
            ax.text(
                0.5,
                0.5,
                f"{NOTHING_RAN}:\ncorrectness and speed were not measured",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=11,
            )
        ax.set_xscale("log")
        ax.set_xlim(thresholds[0], thresholds[-1])
        ax.set_ylim(0.0, 1.02)
        ax.set_title(title)
        ax.set_xlabel("speedup threshold p (× library baseline)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("fraction of turns")
    return [(ax, inst, palette) for ax, (inst, _) in zip(axes, _PANELS, strict=True)]


def _legend(target: FigureBase, ax: Axes) -> None:
    target.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize=8)


def _draw_tasks(target: FigureBase, runs: Sequence[RecordedRun], title: str | None = None) -> None:
    """One line per task; a dashed vertical line at each task's best counting speedup."""
    curves = [
        (f"{run.label} · {task_id}" if len(runs) > 1 else task_id, run.trajectories(task_id))
        for run in runs
        for task_id in run.tasks
    ]
    thresholds = _thresholds(runs)
    panels = _panels(target, runs, thresholds, len(curves))
    for ax, inst, palette in panels:
        for index, (label, trajectories) in enumerate(curves):
            color = palette(index % palette.N)
            values = [value or 0.0 for value in fast_p_curve(trajectories, thresholds, inst=inst)]
            ax.step(thresholds, values, where="post", color=color, label=label)
            best = best_speedup(trajectories, inst=inst)
            if best is not None:
                ax.axvline(best, color=color, linestyle="--", linewidth=1)
                ax.annotate(
                    f"{best:.3g}×",
                    # Staggered, so that the labels of nearby lines do not overprint.
                    xy=(best, 0.98 - 0.12 * (index % 5)),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    ha="right",
                    va="top",
                    fontsize=8,
                    color=color,
                )
    if title is not None:
        target.suptitle(title)
    _legend(target, panels[0][0])


def _draw_models(target: FigureBase, runs: Sequence[RecordedRun]) -> None:
    """Per agent, knowledge level and language: the mean over prompt variants, in a min–max
    band."""
    models = by_model(runs)
    thresholds = _thresholds(runs)
    panels = _panels(target, runs, thresholds, len(models))
    for ax, inst, palette in panels:
        for index, model in enumerate(models):
            color = palette(index % palette.N)
            curves = [
                fast_p_curve(model.trajectories(variant), thresholds, inst=inst)
                for variant in sorted(model.variants)
            ]
            spreads = [Spread.of(values) for values in zip(*curves, strict=True)]
            ax.fill_between(
                thresholds,
                [spread.low or 0.0 for spread in spreads],
                [spread.high or 0.0 for spread in spreads],
                step="post",
                color=color,
                alpha=0.2,
                linewidth=0,
            )
            mean = [spread.mean or 0.0 for spread in spreads]
            ax.step(thresholds, mean, where="post", color=color, label=model.label)
    target.suptitle("Per agent (knowledge): mean over prompt variants, shaded from min to max")
    _legend(target, panels[0][0])
