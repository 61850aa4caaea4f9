"""The model is part of the run: every checkpoint records the model config it trained (the
resolved Hugging Face config for hf_causal_lm), a resume whose model differs is refused on the
driver naming the fields, and jobs.export_hf builds the model the checkpoint recorded, not the
one today's config file describes."""

from __future__ import annotations

import json

import pyarrow.fs as pafs
import pytest
import torch
import yaml

from jobs import export_hf
from pipeline.learn.checkpoint import DataPosition, ResumeError, TrainState, save_checkpoint
from pipeline.learn.factory import build_model
from pipeline.learn.model_record import model_changes, model_record
from pipeline.train.resume_check import check_resume_on_driver
from tests.helpers import TINY_LLAMA, tiny_config, tiny_raw

transformers = pytest.importorskip("transformers")

VOCAB = 64
LLAMA = TINY_LLAMA
# The same parameter names and shapes, another model: a window and another rotary base.
EDITED = {**LLAMA, "model_type": "mistral", "sliding_window": 4, "rope_theta": 500000.0}


def _raw(tmp_path, hf_config=None, **model):
    if hf_config is not None:
        model = {"name": "hf_causal_lm", "vocab_size": VOCAB, "hf_config": hf_config, **model}
    return tiny_raw(tmp_path, model=model)


def _cfg(tmp_path, hf_config=None, **model):
    return tiny_config(tmp_path, model=_raw(tmp_path, hf_config, **model)["model"])


def _checkpoint(tmp_path, cfg, step=10):
    """A run directory holding one checkpoint of `cfg`'s model, as the trainer writes it."""
    torch.manual_seed(0)
    model = build_model(cfg.model, max_positions=64)
    rdir = tmp_path / "runs" / cfg.checkpoint.run_name
    d = rdir / f"checkpoint_step{step:08d}"
    state = TrainState(
        model=model.state_dict(),
        optimizer={},
        scheduler={},
        position=DataPosition(5, 0, "h", 2, {}, step),  # past the epochs: no data check
        wandb_run_id="x",
        model_record=model_record(cfg.model),
    )
    save_checkpoint(d, state, rank=0)
    return model, rdir, d


def test_the_record_of_an_hf_model_is_its_resolved_config_and_names_what_differs(tmp_path):
    a = model_record(_cfg(tmp_path, LLAMA).model)
    assert a["hf_config"]["rope_parameters"]["rope_theta"] == 10000.0  # a default, filled in
    assert a["hf_config"]["vocab_size"] == VOCAB  # defaulted from model.vocab_size
    assert model_changes(a, model_record(_cfg(tmp_path, dict(LLAMA)).model)) == ""
    changed = model_changes(a, model_record(_cfg(tmp_path, EDITED).model))
    assert "model.hf_config.model_type: 'llama' -> 'mistral'" in changed
    assert "model.hf_config.sliding_window: None -> 4" in changed
    assert "model.hf_config.rope_parameters.rope_theta: 10000.0 -> 500000.0" in changed


def test_a_resume_under_an_edited_hf_config_is_refused_on_the_driver_naming_the_fields(tmp_path):
    cfg = _cfg(tmp_path, LLAMA)
    _, rdir, d = _checkpoint(tmp_path, cfg)
    fs = pafs.LocalFileSystem()
    check_resume_on_driver(cfg, fs, str(rdir), [0, 32, 64], [])  # the same model: fine
    with pytest.raises(ResumeError) as e:
        check_resume_on_driver(_cfg(tmp_path, EDITED), fs, str(rdir), [0, 32, 64], [])
    msg = str(e.value)
    assert msg.startswith(f"cannot resume: the checkpoint {d} was trained as another model (")
    assert "model_type: 'llama' -> 'mistral'" in msg and "\n" not in msg


def test_a_resume_with_another_d_model_is_refused_on_the_driver(tmp_path):
    cfg = _cfg(tmp_path, d_model=32)
    _, rdir, _ = _checkpoint(tmp_path, cfg)
    with pytest.raises(ResumeError, match=r"another model \(model.d_model: 32 -> 64\)"):
        check_resume_on_driver(
            _cfg(tmp_path, d_model=64), pafs.LocalFileSystem(), str(rdir), [], []
        )


def _export(tmp_path, hf_config, *extra):
    config = tmp_path / "my.yaml"
    config.write_text(yaml.safe_dump(_raw(tmp_path, hf_config)))
    return export_hf.main(["--config", str(config), "--out", str(tmp_path / "out"), *extra])


def test_export_builds_the_recorded_model_not_the_edited_config(tmp_path, capsys):
    trained, _, _ = _checkpoint(tmp_path, _cfg(tmp_path, LLAMA))
    assert _export(tmp_path, EDITED) == 0
    out = capsys.readouterr().out
    assert "exported the model the checkpoint was trained as; the config differs (" in out
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert exported.config.model_type == "llama"
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "llama"
    ids = torch.randint(0, VOCAB, (1, 24))
    with torch.no_grad():
        want = trained.eval()(ids, torch.ones_like(ids), torch.arange(24)[None])
        torch.testing.assert_close(exported(ids).logits, want)


def test_export_ends_a_folder_that_is_not_a_checkpoint_in_one_line(tmp_path, capsys):
    (tmp_path / "nothing").mkdir()
    assert _export(tmp_path, LLAMA, "--checkpoint", str(tmp_path / "nothing")) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: {tmp_path / 'nothing'} is not a checkpoint")
        and err.count("\n") == 1
    )


def test_export_ends_weights_that_do_not_fit_in_one_line(tmp_path, capsys):
    _, _, d = _checkpoint(tmp_path, _cfg(tmp_path, LLAMA))
    meta = json.loads((d / "state.json").read_text())
    meta["model"] = None  # an older checkpoint: built from the config, which is wider now
    (d / "state.json").write_text(json.dumps(meta))
    assert _export(tmp_path, {**LLAMA, "hidden_size": 64}) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: checkpoint {d}'s weights do not fit") and err.count("\n") == 1
    assert "size mismatch" in err and "Traceback" not in err
