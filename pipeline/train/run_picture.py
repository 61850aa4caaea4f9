"""The picture of a run: one PNG drawn from its step history, with no account and no network.

Five panels answer the question a loss curve under bucketed batches raises -- do its jumps mean
anything? -- and show what the pipeline costs: the raw step loss (each step coloured by its
bucket) against the bucket-debiased loss and, with an `eval:` section, the held-out loss (the
answer that does not depend on which bucket the last batch came from), each bucket's own loss over
the run (and its held-out loss; for a run with one bucket, the loss of each document length
range, held-out too), the learning rate,
padding efficiency and real tokens per second. A sixth panel states the run in numbers, among
them the readability ratio: the variance of the step-to-step change of the debiased loss over
that of the raw loss (below 1: the debiased curve is the steadier one to read).

`draw_run(RUN_DIR)` finds the run's latest complete checkpoint (local or s3://) from the
checkpoints' `state.json` and reads only its `history.parquet` besides; `python -m jobs.plot_run
RUN_DIR` is its command line.
"""

from __future__ import annotations

import os

import numpy as np

from pipeline.core.metrics import readability_ratio
from pipeline.train.history import (
    HISTORY_FILE,
    EvalHistory,
    StepHistory,
    read_evals,
    read_history,
)
from pipeline.train.picture_jumpiness import draw_jumpiness, history_jumpiness
from pipeline.train.picture_ranges import (
    draw_range_evals,
    draw_range_losses,
    has_ranges,
    range_lines,
)
from pipeline.train.reference import draw_reference, reference_lines, run_reference

__all__ = ["PICTURE_FILE", "readability", "draw_history", "draw_run", "default_picture_path"]

PICTURE_FILE = "run.png"


def _rolling_median(x: np.ndarray, window: int) -> np.ndarray:
    """Median of the last `window` values at each point (fewer at the start)."""
    if x.size == 0:
        return x
    w = max(1, min(window, x.size))
    pad = np.concatenate([np.full(w - 1, np.nan), x.astype(float)])
    view = np.lib.stride_tricks.sliding_window_view(pad, w)
    return np.nanmedian(view, axis=1)


def readability(loss: np.ndarray, debiased: np.ndarray) -> float:
    """Step-to-step variance of the debiased loss over that of the raw loss, after the first
    quarter of the run (before every bucket's offset can be known), as BENCHMARKS.md measures
    it (`metrics.readability_ratio`)."""
    skip = len(loss) // 4
    return readability_ratio(loss[skip:], debiased[skip:])[2]


def reading_of(ratio: float, n_buckets: int) -> list[str]:
    """What the readability ratio says about this run, in lines of the text panel. With one
    bucket the debiased loss is the raw loss (no offset to remove), so the ratio is 1."""
    if n_buckets < 2:
        return ["one bucket: no bucket offsets to", "remove, the two curves are the same"]
    if not np.isfinite(ratio):
        return ["(too few steps to measure it)"]
    if ratio < 1:
        return [
            "below 1: the raw curve jumps with the",
            "bucket mix; the debiased one is the",
            "steadier to read",
        ]
    return [
        "not below 1: in this run the debiased",
        "curve is no steadier than the raw one",
        "(the bucket offsets take more steps to",
        "learn than this run had)",
    ]


def _bucket_curves(step: np.ndarray, bucket: np.ndarray, loss: np.ndarray, k: int):
    """(the bucket's steps, its losses smoothed over its own steps: an exponential mean with
    weight 1/2 on the newest) for bucket k; None if it has no finite step."""
    sel = (bucket == k) & np.isfinite(loss)
    if not sel.any():
        return None
    x, y = step[sel], loss[sel].astype(np.float64)
    out = np.empty_like(y)
    acc = y[0]
    for i, v in enumerate(y):  # one value per step of one bucket: a few hundred at most
        acc = 0.5 * acc + 0.5 * v
        out[i] = acc
    return x, out


def _bucket_label(k: int, edges: list[int] | None) -> str:
    if edges and k + 1 < len(edges):
        return f"{edges[k] + 1}-{edges[k + 1]} tok"
    return f"bucket {k}"


def draw_history(
    history: StepHistory,
    path: str,
    *,
    title: str = "",
    edges: list[int] | None = None,
    evals: EvalHistory | None = None,
    reference: dict | None = None,
) -> str:
    """Write the run's PNG to `path` (a local file); returns `path`. With `evals`, the held-out
    loss is drawn over the training curves, and each bucket's held-out loss over its own."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on clusters or in CI
    import matplotlib.pyplot as plt

    a = history.arrays()
    ranges = history.range_edges if has_ranges(a) else []
    if a["step"].size == 0:
        raise ValueError("the run has no recorded steps to draw")
    bucket = a["bucket"].astype(int)
    n_buckets = int(max(bucket.max() + 1, len(edges) - 1 if edges else 0))
    cmap = plt.get_cmap("viridis", max(n_buckets, 2))
    ev = evals.arrays() if evals is not None and len(evals) else None

    fig, axes = plt.subplots(2, 3, figsize=(16, 9.2))
    (ax_loss, ax_bucket, ax_lr), (ax_pad, ax_tps, ax_text) = axes
    _draw_loss(ax_loss, a, ev, cmap, n_buckets)
    if reference:  # eval.reference_run's held-out curve, at equal real tokens
        draw_reference(ax_loss, a, reference)
        ax_loss.legend(loc="upper right", fontsize=8)
    if ranges and n_buckets < 2:  # every step mixes every length: the loss by length instead
        draw_range_losses(ax_bucket, a, ranges, plt.get_cmap("viridis"))
        if _held_by_length(ev, evals, ranges) is not None:
            draw_range_evals(ax_bucket, ev, ranges, plt.get_cmap("viridis"))
    else:
        _draw_bucket_losses(fig, ax_bucket, a, ev, cmap, n_buckets, edges)
    ax_lr.plot(a["step"], a["lr"], color="#4477aa", lw=1.2)
    ax_lr.set_title("learning rate")
    ax_lr.set_xlabel("global step")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    _draw_padding(ax_pad, a)
    _draw_speed(ax_tps, a)
    ax_text.axis("off")
    jumpy = history_jumpiness(a)
    held = _held_by_length(ev, evals, ranges)
    text = "\n".join(_summary_lines(a, ev, n_buckets, edges, ranges, reference or {}, held=held))
    ax_text.text(0.0, 1.0, text, va="top", ha="left", family="monospace", fontsize=9.5)
    fig.suptitle(title or "bucketray run", fontsize=12)
    fig.tight_layout()
    fig.subplots_adjust(bottom=0.14)  # a strip under the panels for the jumpiness bar
    draw_jumpiness(fig, ax_text, jumpy)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _draw_loss(ax, a: dict, ev: dict | None, cmap, n_buckets: int) -> None:
    """Raw step loss (dots coloured by bucket), the debiased loss and the held-out loss."""
    step, loss = a["step"], a["loss"].astype(float)
    ax.plot(step, loss, color="#999999", lw=0.5, zorder=1, label="raw step loss")
    if n_buckets > 1:  # with one bucket the debiased loss is the raw one
        ax.plot(
            step, a["debiased"].astype(float), color="#cc3311", lw=1.3, alpha=0.85, zorder=2,
            label="debiased loss",
        )  # fmt: skip
    ax.scatter(
        step, loss, c=a["bucket"].astype(int), cmap=cmap, vmin=0, vmax=n_buckets - 1, s=9,
        lw=0, zorder=3,
    )  # fmt: skip
    if ev is not None:
        ax.plot(
            ev["step"], ev["loss"], color="#000000", lw=1.6, marker="o", ms=4, zorder=4,
            label="held-out loss",
        )  # fmt: skip
        _clip_to_training(ax, loss, ev["loss"])
    held = ", held-out" if ev is not None else ""
    what = "raw (dots by bucket), debiased" if n_buckets > 1 else "each step"
    ax.set_title(f"loss: {what}{held}")
    ax.set_xlabel("global step")
    ax.set_ylabel("loss (nats per supervised token)")
    ax.legend(loc="upper right", fontsize=8)


def _draw_bucket_losses(
    fig, ax, a: dict, ev: dict | None, cmap, n_buckets: int, edges: list[int] | None
) -> None:
    """Each bucket's loss over its own steps (and its held-out loss as dots), a colour bar of
    the buckets' lengths."""
    import matplotlib.pyplot as plt

    step, bucket, loss = a["step"], a["bucket"].astype(int), a["loss"].astype(float)
    for k in range(n_buckets):
        curve = _bucket_curves(step, bucket, loss, k)
        if curve is not None:
            ax.plot(*curve, color=cmap(k), lw=1.0)
        if ev is not None and k < ev["loss_by_bucket"].shape[1]:
            ax.plot(ev["step"], ev["loss_by_bucket"][:, k], color=cmap(k), lw=0, marker="o", ms=3)
    held = "; held-out: dots" if ev is not None else ""
    ax.set_title(f"each bucket's loss over its own steps{held}")
    ax.set_xlabel("global step")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(-0.5, n_buckets - 0.5))
    bar = fig.colorbar(sm, ax=ax, pad=0.01)
    ticks = sorted({0, n_buckets // 2, n_buckets - 1})
    bar.set_ticks(ticks)
    bar.set_ticklabels([_bucket_label(k, edges) for k in ticks], fontsize=7)
    bar.set_label("bucket (sample lengths)", fontsize=8)


def _draw_padding(ax, a: dict) -> None:
    """Each step's padding efficiency and the run's."""
    real, padded = a["real"].astype(float), a["padded"].astype(float)
    eff = real / np.maximum(padded, 1.0)
    total_eff = real.sum() / max(padded.sum(), 1.0)
    ax.plot(a["step"], eff, color="#228833", lw=0.6)
    ax.axhline(total_eff, color="#222222", lw=0.8, ls="--", label=f"run: {total_eff:.3f}")
    ax.set_ylim(max(0.0, float(np.nanmin(eff)) - 0.05), 1.005)
    ax.set_title("padding efficiency (real / padded tokens)")
    ax.set_xlabel("global step")
    ax.legend(loc="lower right", fontsize=8)


def _draw_speed(ax, a: dict) -> None:
    """Real tokens per second, each step's and a rolling median."""
    step = a["step"]
    tps = a["real"].astype(float) / np.maximum(a["seconds"].astype(float), 1e-9)
    ax.plot(step, tps / 1e3, color="#bbbbbb", lw=0.5, label="each step")
    ax.plot(step, _rolling_median(tps, 25) / 1e3, color="#aa3377", lw=1.4, label="median of 25")
    top = np.nanpercentile(tps, 99) / 1e3 if tps.size else 1.0
    ax.set_ylim(0, max(top * 1.1, 1e-3))
    ax.set_title("real tokens per second (all ranks)")
    ax.set_xlabel("global step")
    ax.set_ylabel("Ktok/s")
    ax.legend(loc="lower right", fontsize=8)


def _summary_lines(
    a: dict,
    ev: dict | None,
    n_buckets: int,
    edges: list[int] | None,
    ranges: list[int],
    reference: dict | None = None,
    held: np.ndarray | None = None,
) -> list:
    """The text panel: the run in figures, the held-out evaluations and how to read the loss."""
    step, loss = a["step"], a["loss"].astype(float)
    real, padded, secs = (a[c].astype(float) for c in ("real", "padded", "seconds"))
    tps = real / np.maximum(secs, 1e-9)
    ratio = readability(loss, a["debiased"].astype(float))
    first = loss[np.isfinite(loss)][:10]
    last = loss[np.isfinite(loss)][-10:]
    lines = [
        f"{int(step[-1]):,} global steps, {int(a['epoch'].max()) + 1} epoch(s)",
        f"{real.sum():,.0f} real tokens, {n_buckets} bucket{'s' if n_buckets != 1 else ''}",
        f"loss: first 10 steps {np.mean(first):.3f}, last 10 {np.mean(last):.3f}",
        f"padding efficiency {real.sum() / max(padded.sum(), 1.0):.3f}",
        f"median {np.nanmedian(tps) / 1e3:.1f} Ktok/s, {secs.sum() / 60:.1f} min of steps",
        *_eval_lines(ev),
        *reference_lines(a, ev, reference or {}),
        "",
    ]
    if ranges and n_buckets < 2:
        lines += range_lines(a, ranges, held=None if held is None else held[-1])
    else:
        lines += [
            "step-to-step variance, debiased / raw",
            f"(after the first quarter): {ratio:.2f}",
            *reading_of(ratio, n_buckets),
        ]
    if edges:
        lines += ["", "edges: " + _wrap_edges(edges)]
    return lines


def _held_by_length(ev: dict | None, evals: EvalHistory | None, ranges: list[int]):
    """[evaluations, ranges]: the held-out loss by the run's length ranges, where its
    evaluations recorded it by the same ranges as its training loss; None otherwise."""
    if ev is None or not ranges or evals is None or list(evals.range_edges) != list(ranges):
        return None
    return ev.get("loss_by_length")


def _clip_to_training(ax, loss: np.ndarray, held: np.ndarray) -> None:
    """Keep the y axis on the training curves' range (plus the held-out points): a step-0
    evaluation of the untrained model would otherwise squash every curve."""
    finite = loss[np.isfinite(loss)]
    if finite.size == 0:
        return
    late = held[1:] if held.size > 1 else held
    lo = float(min(np.nanmin(finite), np.nanmin(late) if late.size else np.inf))
    hi = float(np.nanpercentile(finite, 99))
    pad = 0.05 * max(hi - lo, 1e-3)
    ax.set_ylim(lo - pad, hi + pad)


def _eval_lines(ev: dict | None) -> list[str]:
    if ev is None:
        return ["held-out loss: no eval section"]
    steps, loss = ev["step"].astype(int), ev["loss"]
    return [
        f"held-out loss, {len(steps)} evaluations of",
        f"  {int(ev['samples'][-1]):,} samples: {loss[0]:.3f} at step {steps[0]},",
        f"  {loss[-1]:.3f} at step {steps[-1]} (best {np.nanmin(loss):.3f})",
    ]


def _wrap_edges(edges: list[int], width: int = 40) -> str:
    out, line = [], ""
    for e in edges:
        piece = f"{e}, "
        if len(line) + len(piece) > width:
            out.append(line.rstrip())
            line = "       "
        line += piece
    out.append(line.rstrip(", "))
    return "\n".join(out)


def default_picture_path(run_dir: str) -> str:
    """Beside the checkpoints for a local run; in the current directory for a remote one."""
    if "://" in run_dir:
        return os.path.abspath(f"{run_dir.rstrip('/').rsplit('/', 1)[-1]}-{PICTURE_FILE}")
    return os.path.join(run_dir, PICTURE_FILE)


def draw_run(run_dir: str, out: str | None = None) -> str:
    """Draw the picture of the run at `run_dir` (local path or URI) from its latest checkpoint."""
    from pipeline.data.fs import filesystem_for
    from pipeline.train.resume_check import latest_position

    fs, rdir = filesystem_for(run_dir)
    found = latest_position(fs, rdir.rstrip("/"))  # reads each checkpoint's state.json once
    if found is None:
        raise FileNotFoundError(f"no complete checkpoint under {run_dir}: nothing to draw yet")
    path, position = found
    history = read_history(fs, path)
    if len(history) == 0:
        raise FileNotFoundError(
            f"{path} has no step history ({HISTORY_FILE}): it was written before runs recorded one"
        )
    edges = position.global_batch.get("buckets.edges")
    name = run_dir.rstrip("/").rsplit("/", 1)[-1]
    evals = read_evals(fs, path)
    if len(evals) == 0:  # eval.mode=async records its evaluations beside the checkpoints
        from pipeline.train.evaluate_run import read_async_evals

        evals = read_async_evals(fs, rdir, len(edges) - 1 if edges else 1)
    out = out or default_picture_path(run_dir)
    reference = run_reference(fs, path)
    return draw_history(history, out, title=name, edges=edges, evals=evals, reference=reference)
