"""A config file is read strictly: a key written twice is refused naming it and both lines, a
file YAML cannot read names its line and column, and `--set` types a mapping it is given."""

from __future__ import annotations

import pytest

from jobs import train as train_cli
from pipeline.core.config import ConfigError, load_config


def _write(tmp_path, text: str):
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_a_section_written_twice_is_refused_naming_the_key_and_both_lines(tmp_path):
    p = _write(
        tmp_path,
        "model:\n  name: hf_causal_lm\n  hf_config: {model_type: llama}\n"
        "data:\n  synthetic: {}\n"
        "model:\n  d_model: 64\n",
    )
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: key 'model' appears twice (lines 1 and 6)") and "\n" not in msg


def test_a_field_written_twice_inside_a_section_is_refused_too(tmp_path):
    p = _write(tmp_path, "data:\n  synthetic: {}\ntrain:\n  lr: 0.1\n  epochs: 2\n  lr: 0.01\n")
    with pytest.raises(ConfigError, match=r"key 'lr' appears twice \(lines 4 and 6\)"):
        load_config(p)


def test_a_key_written_twice_in_a_set_value_is_refused():
    with pytest.raises(ConfigError, match=r"^--set model.options: .*key 'a' appears twice"):
        load_config(None, ["data.synthetic={}", "model.options={a: 1, a: 2}"])


@pytest.mark.parametrize(
    "text, where",
    [
        ("data:\n  synthetic: {}\ntrain:\n\tlr: 0.1\n", "line 4 column 1: a tab character"),
        ("data:\n  synthetic: {}\n  max_length: [64\n", "line 4 column 1: expected ',' or ']'"),
    ],
    ids=["tab", "unclosed-bracket"],
)
def test_a_file_yaml_cannot_read_is_one_line_naming_file_line_and_column(tmp_path, text, where):
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}: {where}") and "\n" not in str(e.value)


def test_jobs_train_ends_a_tab_in_the_config_with_one_line_and_exit_2(tmp_path, capsys):
    p = _write(tmp_path, "data:\n  synthetic: {}\ntrain:\n\tlr: 0.1\n")
    assert train_cli.main(["--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "line 4 column 1" in err and "spaces" in err


def test_set_types_an_inline_mapping_for_a_field_that_also_takes_a_path():
    cfg = load_config(
        None,
        [
            "data.synthetic={}",
            "model.name=hf_causal_lm",
            "model.hf_config={model_type: llama, hidden_size: 32, rope_theta: 500000.0}",
        ],
    )
    assert cfg.model.hf_config == {"model_type": "llama", "hidden_size": 32, "rope_theta": 5e5}
    path = load_config(
        None, ["data.synthetic={}", "model.name=hf_causal_lm", "model.hf_config=cfg/config.json"]
    )
    assert path.model.hf_config == "cfg/config.json"  # text stays text
