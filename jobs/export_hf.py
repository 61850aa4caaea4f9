"""Export a trained `hf_causal_lm` run as a Hugging Face model directory (`save_pretrained`).

    python -m jobs.export_hf --config my.yaml --out my-model [--tokenizer tokenizer.json]

Takes the run's latest checkpoint under checkpoint.storage_path/run_name (or --checkpoint DIR,
local paths only) and writes config.json + model.safetensors, plus the tokenizer files when
--tokenizer is given, so `AutoModelForCausalLM.from_pretrained(OUT)` loads the trained weights.
The model is built from the config the checkpoint recorded (the model the run trained), not from
today's config file: an `hf_config` edited since is named in one line and not used. A folder that
is not a checkpoint, or weights that do not fit, end in one line (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs._cli import add_overrides
from pipeline.core.config import ConfigError, load_config
from pipeline.learn.checkpoint import CheckpointError, ResumeError


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint directory of a run (names carry the zero-padded step)."""
    found = sorted(p for p in run_dir.glob("checkpoint_*") if (p / "state.json").is_file())
    if not found:
        raise ConfigError(f"no checkpoint under {run_dir}: train first, or pass --checkpoint")
    return found[-1]


def _checkpoint_model(cfg, state) -> tuple[object, str | None]:
    """The HFCausalLM the checkpoint's weights belong to, and a note when the config's model
    differs from it. Built from the model record the checkpoint holds (the model the run
    trained), or, in a checkpoint older than records, from the config."""
    from pipeline.learn.factory import HF_CAUSAL_LM, HFCausalLM, build_model
    from pipeline.learn.model_record import hf_config_from_record, model_changes, model_record

    recorded = state.model_record
    if recorded is None:
        if cfg.model.name != HF_CAUSAL_LM:
            raise ConfigError(f"model.name={cfg.model.name!r}: only hf_causal_lm runs export")
        limit = model_record(cfg.model)["hf_config"].get("max_position_embeddings") or 1
        note = "this checkpoint records no model config: exported as the config builds it"
        return build_model(cfg.model, max_positions=limit), note
    if recorded.get("name") != HF_CAUSAL_LM:
        raise ConfigError(
            f"the checkpoint trained model.name={recorded.get('name')!r}: only hf_causal_lm "
            "runs export"
        )
    from transformers import AutoModelForCausalLM

    model = HFCausalLM(AutoModelForCausalLM.from_config(hf_config_from_record(recorded)))
    note = None
    if cfg.model.name == HF_CAUSAL_LM:
        changed = model_changes(recorded, model_record(cfg.model))
        if changed:
            note = (
                f"exported the model the checkpoint was trained as; the config differs ({changed})"
            )
    return model, note


def export(cfg, checkpoint: Path, out: Path, tokenizer: str | None = None) -> Path:
    from pipeline.learn.checkpoint import load_checkpoint
    from pipeline.learn.model_record import load_weights

    state = load_checkpoint(checkpoint)
    model, note = _checkpoint_model(cfg, state)
    if note:
        print(f"[bucketray] {note}", flush=True)
    load_weights(model, state.model, where=f"checkpoint {checkpoint}")
    model.hf.save_pretrained(out)
    if tokenizer is not None and Path(tokenizer).is_dir():  # a save_pretrained folder
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer, local_files_only=True).save_pretrained(out)
    elif tokenizer is not None:
        from transformers import PreTrainedTokenizerFast

        PreTrainedTokenizerFast(tokenizer_file=str(tokenizer)).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.export_hf", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--config", required=True, help="the run's YAML config")
    add_overrides(ap)
    ap.add_argument("--checkpoint", help="checkpoint directory (default: the run's latest)")
    ap.add_argument(
        "--tokenizer", help="tokenizer.json, or a tokenizer folder, to save beside the model"
    )
    ap.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args(argv)
    try:
        cfg = load_config(a.config, a.overrides)
        run_dir = (
            Path(cfg.checkpoint.storage_path).expanduser().absolute() / cfg.checkpoint.run_name
        )
        ckpt = Path(a.checkpoint) if a.checkpoint else latest_checkpoint(run_dir)
        out = export(cfg, ckpt, Path(a.out), a.tokenizer)
    except (ConfigError, ValueError, OSError, CheckpointError, ResumeError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"[bucketray] exported {ckpt} -> {out} (AutoModelForCausalLM.from_pretrained)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
