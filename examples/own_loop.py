"""Your own model and loop on bucketray's delivery (docs/own_loop.md): python examples/own_loop.py
configs/local.yaml batching.token_budget=16384 [key=value ...] (a GRU needs padded batches)"""

import os
import sys
import tempfile

import torch
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
    losses = []
    for mb in api.iter_run(delivery):  # one micro-batch per global step, epoch after epoch
        x = api.batch_tensors(mb, device)
        loss = api.next_token_loss(model(x["input_ids"]), x["labels"])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    metrics = {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]}
    with tempfile.TemporaryDirectory() as d:  # rank 0 saves the weights as a Ray Train checkpoint
        torch.save(getattr(model, "module", model).state_dict(), f"{d}/model.pt")
        rank0 = get_context().get_world_rank() == 0
        report(metrics, checkpoint=Checkpoint.from_directory(d) if rank0 else None)


def main(args: list[str]) -> None:
    cfg = load_config(args[0] if args else "configs/local.yaml", args[1:])
    if cfg.batching.mode == "packed":  # a GRU would read from one document into the next
        sys.exit("own_loop: this GRU needs padded batches: add batching.token_budget=16384")
    cpus = {"CPU": cfg.scaling.cpus_per_worker}
    scale = ScalingConfig(num_workers=cfg.scaling.num_workers, resources_per_worker=cpus)
    run = RunConfig(storage_path=os.path.abspath(cfg.checkpoint.storage_path))
    with api.prepare_delivery(cfg) as delivery:  # starts Ray if needed; the feeder stops after
        loop = {"delivery": delivery.to_dict(), "vocab": cfg.model.vocab_size, "lr": cfg.train.lr}
        t = TorchTrainer(train_loop, train_loop_config=loop, scaling_config=scale, run_config=run)
        result = t.fit()
    print("own_loop:", result.metrics, "weights:", result.checkpoint.path)


if __name__ == "__main__":
    main(sys.argv[1:])
