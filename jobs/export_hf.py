"""Export a trained `hf_causal_lm` run as a Hugging Face model directory (`save_pretrained`).

    python -m jobs.export_hf --config my.yaml --out my-model [--tokenizer tokenizer.json]

Takes the run's latest checkpoint under checkpoint.storage_path/run_name (or --checkpoint DIR,
local paths only) and writes config.json + model.safetensors, plus the tokenizer files when
--tokenizer is given, so `AutoModelForCausalLM.from_pretrained(OUT)` loads the trained weights.
The exported config's bos / eos / pad ids are the tokenizer's (a bare tokenizer.json's roles
are read from its post-processor's template and the usual names), so `generate()` stops at
the tokenizer's end-of-sequence token.
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
    if tokenizer is not None:
        tok = _load_tokenizer(tokenizer)
        print(f"[bucketray] {_use_special_tokens(model.hf, tok)}", flush=True)
        tok.save_pretrained(out)
    model.hf.save_pretrained(out)
    return out


# Names that say a special token's role, for a bare tokenizer.json (which records no roles).
_ROLE_NAMES = {
    "bos_token": ("[bos]", "<s>", "<bos>", "<|bos|>", "<|begin_of_text|>", "<|startoftext|>"),
    "eos_token": ("[eos]", "</s>", "<eos>", "<|eos|>", "<|end_of_text|>", "<|endoftext|>"),
    "pad_token": ("[pad]", "<pad>", "<|pad|>", "<|padding|>"),
    "unk_token": ("[unk]", "<unk>", "<|unk|>"),
}


def _template_specials(proc: dict | None) -> dict[str, str]:
    """bos / eos from a tokenizer.json post-processor: the special token its single-sequence
    template puts first and the one it puts last (`[BOS] $A [EOS]`), or Roberta/Bert's cls
    and sep."""
    if not proc:
        return {}
    if proc.get("type") == "Sequence":
        found: dict[str, str] = {}
        for p in proc.get("processors", []):
            found.update(_template_specials(p))
        return found
    if "cls" in proc and "sep" in proc:
        return {"bos_token": proc["cls"][0], "eos_token": proc["sep"][0]}
    items = proc.get("single") or []
    seq = [i for i, x in enumerate(items) if "Sequence" in x]
    if not seq:
        return {}
    out = {}
    before = [x["SpecialToken"]["id"] for x in items[: seq[0]] if "SpecialToken" in x]
    after = [x["SpecialToken"]["id"] for x in items[seq[-1] + 1 :] if "SpecialToken" in x]
    if before:
        out["bos_token"] = before[0]
    if after:
        out["eos_token"] = after[-1]
    return out


def tokenizer_json_specials(path: str) -> dict[str, str]:
    """The roles of a tokenizer.json's special tokens (bos, eos, pad, unk), which a bare
    tokenizer.json does not record: the post-processor's template says bos and eos, the model's
    unk_token says unk, and the usual names say the rest."""
    import json

    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    specials = [t["content"] for t in raw.get("added_tokens", []) if t.get("special")]
    found = {}
    for role, names in _ROLE_NAMES.items():
        match = [t for t in specials if t.lower() in names]
        if match:
            found[role] = match[0]
    unk = (raw.get("model") or {}).get("unk_token")
    if unk:
        found["unk_token"] = unk
    found.update(_template_specials(raw.get("post_processor")))
    return found


def _load_tokenizer(tokenizer: str):
    """A tokenizer folder (save_pretrained) as it is, or a tokenizer.json with the roles of
    its special tokens, so that AutoTokenizer loads the export knowing them."""
    if Path(tokenizer).is_dir():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    if not Path(tokenizer).is_file():
        raise ConfigError(f"--tokenizer {tokenizer}: no such file or folder")
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer), **tokenizer_json_specials(tokenizer)
    )


def _use_special_tokens(hf_model, tok) -> str:
    """Give the model's config and generation config the tokenizer's bos / eos / pad ids (the
    model type's defaults, e.g. Llama's bos=1 eos=2, name other tokens of another tokenizer,
    and generate() would not stop at its end token). Returns the line saying which."""
    ids = {
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    for target in (hf_model.config, hf_model.generation_config):
        for k, v in ids.items():
            setattr(target, k, v)
    shown = ", ".join(f"{k.split('_')[0]} {'none' if v is None else v}" for k, v in ids.items())
    line = f"special tokens from the tokenizer: {shown}"
    if ids["eos_token_id"] is None:
        line += " (no end-of-sequence token: generate() stops only at max_new_tokens)"
    return line


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
