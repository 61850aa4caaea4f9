"""A reference while training (`eval.reference_run`): a finished run's held-out curve against
real tokens, read on the driver, handed to every rank, and each evaluation's standing against
it at the same real tokens (console line, `eval/*` metrics, the run's picture)."""

from __future__ import annotations

import numpy as np

from pipeline.core.compare import Curve
from pipeline.core.config import ConfigError

__all__ = [
    "run_reference",
    "draw_reference",
    "driver_reference",
    "reference_clause",
    "reference_curve",
    "reference_lines",
    "reference_metrics",
]


def reference_curve(reference_run: str | None, heldout_digest: str | None = None) -> dict:
    """{"name", "tokens", "loss", "warning"} of the finished run at `reference_run` ({} for
    none). ConfigError (one line) where it cannot be read or has no evaluations."""
    if not reference_run:
        return {}
    from pipeline.train.compare_runs import RunCurves
    from pipeline.train.run_record import read_run

    try:
        ref = RunCurves(read_run(reference_run))
    except (FileNotFoundError, OSError, ValueError) as e:
        raise ConfigError(f"eval.reference_run: {' '.join(str(e).split())}") from None
    if ref.eval_loss.size == 0:
        raise ConfigError(f"eval.reference_run: {reference_run} has no held-out evaluations")
    other = ref.run.heldout.get("digest")
    warning = ""
    if heldout_digest and other != heldout_digest:
        warning = (
            f"eval.reference_run {ref.name} was evaluated on another held-out set (digest "
            f"{other}, this run {heldout_digest}): its standing is not like for like"
        )
    return {
        "name": ref.name,
        "tokens": [float(x) for x in ref.eval_tokens],
        "loss": [float(x) for x in ref.eval_loss],
        "warning": warning,
    }


def driver_reference(eval_cfg, fs, rdir: str) -> dict:
    """eval.reference_run's curve for the workers ({} for none), read on the driver at the
    start, checked against this run's held-out record (written just before): a reference that
    cannot be read stops the run before any worker starts."""
    if eval_cfg is None or not eval_cfg.reference_run:
        return {}
    from pipeline.train.run_record import read_run_heldout

    digest = read_run_heldout(fs, rdir).get("digest")
    ref = reference_curve(eval_cfg.reference_run, digest)
    print(f"[bucketray] reference run {ref['name']}: {len(ref['loss'])} evaluations", flush=True)
    if ref["warning"]:
        print(f"[bucketray] warning: {ref['warning']}", flush=True)
    return ref


def reference_metrics(reference: dict, tokens: float, loss: float) -> dict[str, float]:
    """`eval/reference_loss` (the reference's held-out loss at `tokens`, interpolated) and
    `eval/vs_reference` (this run's minus it; < 0: better); {} without a reference or past
    its last evaluation."""
    if not reference:
        return {}
    at = Curve.of(reference["tokens"], reference["loss"]).at(float(tokens))
    if not np.isfinite(at):
        return {}
    return {"eval/reference_loss": at, "eval/vs_reference": float(loss) - at}


def reference_clause(reference: dict, metrics: dict[str, float]) -> str:
    """The evaluation line's tail: "; reference NAME 2.6100 at the same tokens: 0.0700 better"."""
    if "eval/vs_reference" not in metrics:
        return ""
    d = metrics["eval/vs_reference"]
    word = "better" if d < 0 else "worse"
    return (
        f" | reference {reference['name']} {metrics['eval/reference_loss']:.4f} at the same "
        f"tokens: {abs(d):.4f} {word}"
    )


def run_reference(fs, checkpoint_path: str) -> dict:
    """The reference named by a checkpoint's recorded config (`eval.reference_run`), for the
    run's picture; {} where there is none or it cannot be read (the picture is drawn without)."""
    import json

    from pipeline.learn.checkpoint import RUN_CONFIG_FILE

    try:
        with fs.open_input_stream(f"{checkpoint_path}/{RUN_CONFIG_FILE}") as f:
            name = (json.loads(f.read()).get("eval") or {}).get("reference_run")
        return reference_curve(name)
    except (FileNotFoundError, OSError, ValueError, ConfigError):
        return {}


def _tokens_at_steps(a: dict, steps: np.ndarray) -> np.ndarray:
    cum = np.cumsum(a["real"].astype(float))
    idx = np.clip(steps.astype(int) - 1, 0, max(cum.size - 1, 0))
    return np.where(steps > 0, cum[idx], 0.0)


def draw_reference(ax, a: dict, reference: dict) -> None:
    """The reference's held-out curve on a picture's step axis, at equal real tokens: each of
    its evaluations drawn at the step where this run had trained as many tokens."""
    if not reference:
        return
    cum = np.cumsum(a["real"].astype(float))
    tok, loss = np.asarray(reference["tokens"]), np.asarray(reference["loss"])
    keep = (tok > 0) & (tok <= cum[-1])
    if keep.any():
        steps = np.interp(tok[keep], cum, a["step"].astype(float))
        ax.plot(steps, loss[keep], color="#ee7733", lw=1.4, ls="--", marker="s", ms=3,
                label=f"reference {reference['name']} (equal tokens)")  # fmt: skip


def reference_lines(a: dict, ev: dict | None, reference: dict) -> list[str]:
    """The text panel's line: the run's last evaluation against the reference at its tokens."""
    if not reference or ev is None or ev["step"].size == 0:
        return []
    tokens = float(_tokens_at_steps(a, ev["step"][-1:])[0])
    m = reference_metrics(reference, tokens, float(ev["loss"][-1]))
    if not m:
        return [f"reference {reference['name']}: not evaluated", "  as far as this run's tokens"]
    d = m["eval/vs_reference"]
    return [
        f"reference {reference['name']}: {m['eval/reference_loss']:.3f}",
        f"  at the same tokens: {abs(d):.3f} {'better' if d < 0 else 'worse'}",
    ]
