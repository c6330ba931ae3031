"""Replay one client's local training of one round from a run's saved global model, with or without the flush of
subnormal numbers (docs/training.md#denormals): prints the training's wall time, and saves or compares the trained
model bit for bit.

    .venv/bin/python scripts/replay_client.py docs/results/denormals/fedadam-s2/run-config.json \\
        docs/results/denormals/fedadam-s2/model-r00003.safetensors --round 4 --client 1 --flush off --save /tmp/off.st
    .venv/bin/python scripts/replay_client.py ... --flush on --compare /tmp/off.st

`model` is a safetensors file of the global model sent in `--round` (a run checkpoint's tensor file, whose model
arrays are named ``arrays/<name>``, or a plain state dict). The client's partition, lr and seed come from the run's
config, as its ClientApp would take them.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from safetensors.torch import load_file, save_file

from hetfl.common.results import load_metrics
from hetfl.common.task import local_train, make_model
from hetfl.common.rundata import model_inputs
from hetfl.data.load import load_partition
from hetfl.data.spec import DataSpec
from hetfl.methods import SCHEMA, validate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="the run's metrics.json, or any JSON file with its 'config'")
    ap.add_argument("model", help="safetensors of the global model sent in --round")
    ap.add_argument("--round", type=int, required=True)
    ap.add_argument("--client", type=int, required=True)
    ap.add_argument("--flush", choices=("on", "off"), default="on", help="off: the loops as before 2026-12-06")
    ap.add_argument("--save", help="write the trained model here")
    ap.add_argument("--compare", help="exit 1 unless the trained model equals this one in every bit")
    args = ap.parse_args(argv)
    cfg = validate(load_metrics(args.config, SCHEMA)["config"])
    if args.flush == "off":
        torch.set_flush_denormal(False)
        torch.set_flush_denormal = lambda on: False  # hetfl.common.train.no_denormals then changes nothing
    tensors = load_file(args.model)
    state = {k.removeprefix("arrays/"): v for k, v in tensors.items() if k.startswith("arrays/")} or tensors
    model = make_model(cfg)
    model.load_state_dict(state)
    spec = DataSpec.from_config(cfg, cfg["num-clients"] or cfg["min-available-nodes"])
    data = model_inputs(load_partition(spec, args.client, cfg["cache-dir"]), cfg)
    t0 = time.perf_counter()
    res = local_train(model, data, cfg, args.round)
    seconds = time.perf_counter() - t0
    print(f"client {args.client}, round {args.round}, flush {args.flush}: {res.steps} steps on {len(data)} samples "
          f"in {seconds:.1f} s, mean loss {res.loss:.10g}")
    trained = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if args.save:
        save_file(trained, args.save)
    if args.compare:
        other = load_file(args.compare)
        same = other.keys() == trained.keys() and all(torch.equal(other[k], trained[k]) for k in trained)
        print("the same model in every bit" if same else "the models differ")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
