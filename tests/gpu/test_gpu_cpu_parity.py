"""The same fp32 steps on the GPU and on the CPU train the same model: the Trainer end to end on
padded batches (loss per step, final weights), and a Hugging Face Llama on packed rows through
the train step (loss per step, then every parameter). Skipped without a CUDA GPU.

fp32 on both devices (bf16 off), TF32 off: the two differ only by the order of floating-point
sums in their kernels, ~1e-6 relative per step; the tolerances below allow that to grow over the
steps, and are far below what a wrong mask, a lost gradient or a wrong loss scale moves (those
change the first step's loss in its second decimal)."""

import dataclasses

import numpy as np
import pytest
import torch

from pipeline.core.config import ModelConfig, TrainConfig
from pipeline.core.packed_collate import collate_packed
from pipeline.data.rechunk import MicroBatch
from pipeline.learn.factory import build_model
from pipeline.learn.optim import build_optimizer
from pipeline.train.step import train_group
from pipeline.train.trainer import Trainer
from tests.unit.trainer_fixtures import Saver, batches_for, config, spec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LOSS_RTOL = 1e-4  # per step's loss, relative
WEIGHT_ATOL = 1e-4  # every parameter after the steps


@pytest.fixture(autouse=True)
def _no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


class _Log:
    """A logger that keeps nothing (the history holds the losses compared)."""

    def __getattr__(self, name):
        return lambda *a, **k: None


def _fit(tmp, device: str):
    cfg = config(tmp, bf16="off")
    torch.manual_seed(0)
    t = Trainer(cfg, dataclasses.replace(spec(tmp), device=torch.device(device)), save=Saver(tmp))
    t.resume(None)
    assert t.fit(batches_for(), _Log()) == "done"
    return t.history.arrays(), {k: v.detach().cpu() for k, v in t.model.state_dict().items()}


def test_trainer_fp32_steps_on_the_gpu_equal_the_same_steps_on_the_cpu(tmp_path):
    h_cpu, w_cpu = _fit(tmp_path / "cpu", "cpu")
    h_gpu, w_gpu = _fit(tmp_path / "gpu", "cuda")
    assert h_gpu["step"].tolist() == h_cpu["step"].tolist()
    np.testing.assert_allclose(h_gpu["loss"], h_cpu["loss"], rtol=LOSS_RTOL)
    np.testing.assert_array_equal(h_gpu["real"], h_cpu["real"])
    for k in w_cpu:
        torch.testing.assert_close(w_gpu[k], w_cpu[k], rtol=0, atol=WEIGHT_ATOL, msg=k)


def _packed_batches(vocab: int, n: int = 4) -> list[MicroBatch]:
    rng = np.random.default_rng(0)
    out = []
    for step in range(n):
        lens = rng.integers(5, 60, 9)
        values = rng.integers(1, vocab, int(lens.sum())).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        b = collate_packed(values, offsets, [0, 3, 6, 9], row_tokens=192)
        t = {k: torch.as_tensor(v) for k, v in b.items() if np.ndim(v) == 2}
        out.append(
            MicroBatch(0, step, 0, np.arange(9) + 9 * step, t["input_ids"], t["attention_mask"],
                       t["labels"], t["position_ids"], int(lens.sum()), 3 * 192)
        )  # fmt: skip
    return out


def test_hf_llama_packed_fp32_steps_on_the_gpu_equal_the_cpu():
    """Three rows per micro-batch: a Hugging Face model's packed attention over several rows,
    with its backward and AdamW, gives the CPU's losses and weights."""
    cfg = ModelConfig(
        name="hf_causal_lm",
        vocab_size=96,
        hf_config={
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
        },
    )
    batches = _packed_batches(cfg.vocab_size)
    runs = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = build_model(cfg, 192).to(device)
        opt = build_optimizer(model, TrainConfig(lr=1e-3))
        losses = []
        for mb in batches:
            s = train_group(model, [mb], device=torch.device(device), world_size=1, bf16=False)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(s.step_loss(0))
        runs[device] = losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}
    np.testing.assert_allclose(runs["cuda"][0], runs["cpu"][0], rtol=LOSS_RTOL)
    for k, v in runs["cpu"][1].items():
        torch.testing.assert_close(runs["cuda"][1][k], v, rtol=0, atol=WEIGHT_ATOL, msg=k)
