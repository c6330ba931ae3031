"""Does torch.compile or bf16 autocast speed up local training here, at the same accuracy? (docs/results/speed-check.md)

For the FMNIST CNN that every long run of docs/results/fens-fair.md, the AdaptiveFL and the SHEFL pages trains, the real
`train` loop in four modes: fp32, bf16 autocast, `torch.compile` (inductor, C++ backend) and both. Per mode and
batch size (16: FENS members, 32: SHEFL, 50: AdaptiveFL), training samples/s after a warm-up (the compile time is
reported apart); and accuracy parity: 2 epochs on 6,000 IID training images from the same initial weights and batch
order, seeds 0-2, scored on 2,000 test images. Run it alone on the machine.

    python scripts/speed_check.py [--out docs/results/speed-check.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetfl.methods import validate  # noqa: E402
from hetfl.common.results import machine_info  # noqa: E402
from hetfl.common.task import make_model  # noqa: E402
from hetfl.common.train import Normalizer, evaluate, train  # noqa: E402
from hetfl.data.load import load_partition, load_test  # noqa: E402
from hetfl.data.spec import DataSpec  # noqa: E402

MODES = {"fp32": (False, "fp32"), "bf16": (False, "bf16"), "compile": (True, "fp32"), "compile+bf16": (True, "bf16")}


def model_for(cfg: dict, seed: int, compiled: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(module to train, module holding the weights): the same initial weights for a seed in every mode."""
    torch.manual_seed(seed)
    model = make_model(cfg)
    return (torch.compile(model) if compiled else model), model


def throughput(cfg: dict, data, norm, batch: int, mode: str, seconds: float) -> dict:
    from scripts.bench_round import samples_per_s

    compiled, precision = MODES[mode]
    net, _ = model_for(cfg, 0, compiled)
    rate, warm = samples_per_s(net, data, norm, batch, precision, seconds, warmup=10, max_steps=20_000)  # warm-up: the compile
    return {"samples_per_s": rate, "warmup_s": warm}


def parity(cfg: dict, data, test, norm, mode: str, seeds: list[int], batch: int) -> list[float]:
    compiled, precision = MODES[mode]
    accs = []
    for seed in seeds:
        net, model = model_for(cfg, seed, compiled)
        train(net, data, norm, epochs=2, batch_size=batch, lr=0.05, momentum=0.9, seed=seed, precision=precision)
        accs.append(evaluate(model, test, norm)[1])
    return accs


def main() -> int:
    p = argparse.ArgumentParser(prog="python scripts/speed_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="docs/results/speed-check.json")
    p.add_argument("--seconds", type=float, default=3.0, help="least measured seconds per throughput figure")
    a = p.parse_args()
    cfg = validate({"dataset": "fashion_mnist", "data-source": "local", "partitioner": "iid", "model": "cnn"})
    data = load_partition(DataSpec.from_config(cfg, 10), 0, cfg["cache-dir"])
    test = load_test("fashion_mnist", "local", cache_dir=cfg["cache-dir"])
    test = type(test)(test.x[:2000], test.y[:2000])
    norm = Normalizer("fashion_mnist")
    out = {"machine": machine_info(), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "throughput": {}, "parity": {}}
    for batch in (16, 32, 50):
        for mode in MODES:
            r = throughput(cfg, data, norm, batch, mode, a.seconds)
            out["throughput"][f"{mode}_b{batch}"] = r
            print(f"batch {batch:>2} {mode:>13}: {r['samples_per_s']:8.0f} samples/s (warm-up {r['warmup_s']:.1f} s)",
                  flush=True)
    for mode in MODES:
        accs = parity(cfg, data, test, norm, mode, [0, 1, 2], 32)
        out["parity"][mode] = accs
        print(f"parity {mode:>13}: {[round(100 * x, 2) for x in accs]} mean {100 * statistics.mean(accs):.2f}",
              flush=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
