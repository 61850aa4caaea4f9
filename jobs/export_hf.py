"""Export a trained `hf_causal_lm` run as a Hugging Face model directory (`save_pretrained`).

    python -m jobs.export_hf --config my.yaml --out my-model [--tokenizer tokenizer.json]

Takes the run's latest checkpoint under checkpoint.storage_path/run_name (or --checkpoint DIR,
local paths only) and writes config.json + model.safetensors, plus the tokenizer files when
--tokenizer is given, so `AutoModelForCausalLM.from_pretrained(OUT)` loads the trained weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs._cli import add_overrides
from pipeline.core.config import ConfigError, load_config


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint directory of a run (names carry the zero-padded step)."""
    found = sorted(p for p in run_dir.glob("checkpoint_*") if (p / "state.json").is_file())
    if not found:
        raise ConfigError(f"no checkpoint under {run_dir}: train first, or pass --checkpoint")
    return found[-1]


def export(cfg, checkpoint: Path, out: Path, tokenizer: str | None = None) -> Path:
    from pipeline.learn.checkpoint import load_checkpoint
    from pipeline.learn.factory import HF_CAUSAL_LM, build_model, hf_config_dict

    if cfg.model.name != HF_CAUSAL_LM:
        raise ConfigError(f"model.name={cfg.model.name!r}: only hf_causal_lm runs export")
    if cfg.model.hf_pretrained is not None:
        from pipeline.learn.pretrained import check_pretrained

        conf = check_pretrained(cfg.model, max_positions=1)
    else:
        conf = hf_config_dict(cfg.model.hf_config)
    limit = conf.get("max_position_embeddings", 1)
    model = build_model(cfg.model, max_positions=limit)
    model.load_state_dict(load_checkpoint(checkpoint).model)
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
    except (ConfigError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[bucketray] exported {ckpt} -> {out} (AutoModelForCausalLM.from_pretrained)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
