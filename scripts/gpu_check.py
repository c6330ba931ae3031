"""`make gpu-check`: what a machine with an NVIDIA GPU must show, in one script (under 8 minutes).

1. The CUDA tests (tests/test_train.py, the ones skipped without a GPU).
2. Training samples/s of the CNN and ResNet-18 on Fashion-MNIST with the project's `train` loop, fp32 and
   bf16 autocast, batch 64 (each measured for a few seconds after a warm-up).
3. SHEFL, 5 rounds, 100 clients in the Simulation Engine with fractional GPUs (--client-gpus 0.25:
   four ClientApps share the GPU), local work cut to 1 epoch so that the whole check fits.
4. A 2-round FedAvg run on the Deployment Engine (SuperLink + 2 SuperNodes as processes) on CUDA.

It writes docs/results/gpu-check-<date>.md (one table: step, result, seconds) and exits non-zero when a
step failed. On a machine without a CUDA device it says so in one line and exits 0.

    python scripts/gpu_check.py            # or: make gpu-check
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def samples_per_s(model_name: str, precision: str, seconds: float = 3.0, batch: int = 64) -> float:
    from hetfl.methods import validate
    from hetfl.common.task import make_model
    from hetfl.common.train import Normalizer, train
    from hetfl.data.load import load_partition
    from hetfl.data.spec import DataSpec

    cfg = validate({"dataset": "fashion_mnist", "data-source": "local", "partitioner": "iid", "model": model_name})
    data = load_partition(DataSpec.from_config(cfg, 10), 0, cfg["cache-dir"])
    model, norm = make_model(cfg), Normalizer("fashion_mnist")
    train(model, data, norm, steps=10, batch_size=batch, precision=precision, device=torch.device("cuda"))  # warm-up
    steps = 20
    while True:
        res = train(model, data, norm, steps=steps, batch_size=batch, precision=precision, device=torch.device("cuda"))
        if res.seconds >= seconds or steps >= 20_000:
            return steps * batch / res.seconds
        steps *= 2


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); nothing to check")
        return 0
    from hetfl import cluster, launch

    launch.setup_signals()
    rows: list[tuple[str, str, float]] = []
    failed = False

    date = time.strftime("%Y-%m-%d")
    out = ROOT / "docs" / "results" / f"gpu-check-{date}.md"
    out.parent.mkdir(parents=True, exist_ok=True)

    def write_report() -> None:  # after every step, so that a check cut off at its time limit still leaves its rows
        lines = [f"# `make gpu-check` ({date})", "",
                 f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
                 f"{platform.processor() or platform.machine()}, Python {platform.python_version()}; "
                 f"command: `make gpu-check` (scripts/gpu_check.py).", "",
                 "| step | result | seconds |", "| --- | --- | --- |"]
        lines += [f"| {n} | {r} | {s:.0f} |" for n, r, s in rows]
        out.write_text("\n".join(lines) + "\n")

    def step(name: str, fn) -> None:
        nonlocal failed
        t0 = time.perf_counter()
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - every step is reported, the check goes on
            result, failed = f"FAILED: {' '.join(str(err).split())[:300]}", True
        rows.append((name, str(result), time.perf_counter() - t0))
        print(f"gpu-check: {name}: {result} ({rows[-1][2]:.0f} s)", flush=True)
        write_report()

    def cuda_tests() -> str:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_train.py", "-k", "cuda"],
                           cwd=ROOT, capture_output=True, text=True)
        last = (p.stdout.strip().splitlines() or ["no output"])[-1]
        if p.returncode != 0:
            raise RuntimeError(last)
        return last

    step("CUDA tests", cuda_tests)
    for model_name in ("cnn", "resnet18"):
        for precision in ("fp32", "bf16"):
            step(f"{model_name} {precision} samples/s (batch 64)", lambda m=model_name, p=precision: f"{samples_per_s(m, p):,.0f}")

    def shefl() -> str:
        run_dir = launch.run(str(ROOT / "configs/shefl/fmnist-dir0.6.toml"),
                             {"num-server-rounds": 5, "local-epochs": 1, "torch-device": "cuda", "checkpoint": False},
                             num_supernodes=100, results_dir=ROOT / "results" / "gpu-check", client_gpus=0.25, timeout=240)
        rows_ = json.loads((run_dir / "metrics.json").read_text())["rounds"]
        return f"accuracy {rows_[-1]['accuracy']:.4f} after 5 rounds; {sum(r['round_s'] for r in rows_[1:]) / 5:.1f} s/round"

    step("SHEFL 5 rounds, 100 clients, Simulation Engine, 0.25 GPU per ClientApp", shefl)

    def deployment() -> str:
        with cluster.local_cluster(2) as c:
            run_dir = cluster.submit(c, str(ROOT / "configs/quickstart.toml"),
                                     {"num-server-rounds": 2, "torch-device": "cuda", "min-available-nodes": 2, "checkpoint": False},
                                     results_dir=ROOT / "results" / "gpu-check", timeout=240)
        rows_ = json.loads((run_dir / "metrics.json").read_text())["rounds"]
        return f"accuracy {rows_[-1]['accuracy']:.4f} after 2 rounds"

    step("FedAvg 2 rounds, Deployment Engine (2 SuperNodes), CUDA", deployment)
    print(f"gpu-check: wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
