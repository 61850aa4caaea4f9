"""Your own model and loop on bucketray's delivery (docs/own_loop.md).

python examples/own_loop.py [CONFIG.yaml [key=value ...]]
"""

import os
import sys
import tempfile

import ray
import torch
import torch.nn.functional as F
from ray.train import Checkpoint, RunConfig, ScalingConfig, get_context, report
from ray.train.torch import TorchTrainer, get_device, prepare_model
from torch import nn

from pipeline.core.config import load_config
from pipeline.data import api


class GRULM(nn.Module):  # any model: this loop calls it as it likes
    def __init__(self, vocab: int, width: int = 64):
        super().__init__()
        self.emb, self.out = nn.Embedding(vocab, width), nn.Linear(width, vocab)
        self.rnn = nn.GRU(width, width, batch_first=True)

    def forward(self, ids):
        return self.out(self.rnn(self.emb(ids))[0])


def train_loop(config: dict) -> None:
    delivery, device = api.Delivery.from_dict(config["delivery"]), get_device()
    model = prepare_model(GRULM(config["vocab"]))
    opt = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    steps, losses = config["steps"], []
    for epoch in range(-(-steps // delivery.steps_per_epoch)):
        for mb in api.iter_micro_batches(delivery, epoch=epoch):
            x = api.batch_tensors(mb, device)
            logits, y = model(x["input_ids"])[:, :-1], x["labels"][:, 1:]
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
            (loss := loss / max(int((y != -100).sum()), 1)).backward()  # empty batch: 0, not NaN
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            if len(losses) == steps:
                break
    metrics = {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]}
    with tempfile.TemporaryDirectory() as d:  # rank 0 saves the weights as a Ray Train checkpoint
        torch.save(getattr(model, "module", model).state_dict(), f"{d}/model.pt")
        rank0 = get_context().get_world_rank() == 0
        report(metrics, checkpoint=Checkpoint.from_directory(d) if rank0 else None)


def main(args: list[str]) -> None:
    cfg = load_config(args[0] if args else "configs/local.yaml", args[1:])
    if not ray.is_initialized():  # RAY_ADDRESS: a cluster (ray job submit sets it); else local
        ray.init(address=os.environ.get("RAY_ADDRESS", "local"))
    delivery = api.prepare_delivery(cfg)
    steps = min(cfg.train.max_steps or 10**9, cfg.train.epochs * delivery.steps_per_epoch)
    loop = {"delivery": delivery.to_dict(), "vocab": cfg.model.vocab_size, "lr": cfg.train.lr}
    loop["steps"] = steps
    cpus = {"CPU": cfg.scaling.cpus_per_worker}
    workers = ScalingConfig(num_workers=cfg.scaling.num_workers, resources_per_worker=cpus)
    store = RunConfig(storage_path=os.path.abspath(cfg.checkpoint.storage_path))
    t = TorchTrainer(train_loop, train_loop_config=loop, scaling_config=workers, run_config=store)
    result = t.fit()
    api.stop_delivery(delivery)
    print("own_loop:", result.metrics, "weights:", result.checkpoint.path)


if __name__ == "__main__":
    main(sys.argv[1:])
