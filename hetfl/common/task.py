"""Glue from a validated run config to data, models, local training and evaluation.

Shared by every method's ServerApp and ClientApp so that each app only adds what its
paper adds. Nothing here talks to the network.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context
from torch import nn

from .config import validate
from .data import DATASETS, ArrayData, DataSpec, load_partition, load_test
from .models import build_model, get_state, set_state
from .train import Normalizer, TrainResult, evaluate, train

log = logging.getLogger("hetfl")


def setup_logging() -> None:
    """INFO-level progress lines from the 'hetfl' logger (once per process)."""
    if not log.handlers:
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(logging.Formatter("%(levelname)s %(asctime)s hetfl: %(message)s", "%H:%M:%S"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False


def seed_everything(seed: int) -> None:
    """Seed Python (Flower's node sampling uses `random`), NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def config_of(context: Context) -> dict[str, Any]:
    """The validated run config of a ServerApp/ClientApp context."""
    return validate(dict(context.run_config))


def num_classes(cfg: dict[str, Any]) -> int:
    return DATASETS[cfg["dataset"]].num_classes


def make_model(cfg: dict[str, Any], width: float | None = None, seed: int | None = None) -> nn.Module:
    """The configured model, initialised deterministically from `seed` (default: the config's)."""
    seed = cfg["seed"] if seed is None else seed
    info = DATASETS[cfg["dataset"]]
    if cfg["model"] == "text":
        from .text import build_text_model

        return build_text_model(cfg["text-model"], info.num_classes, seed)
    torch.manual_seed(seed)
    return build_model(cfg["model"], info.num_classes, info.shape, cfg["width"] if width is None else width)


def model_to_arrays(model: nn.Module) -> ArrayRecord:
    """Model state (parameters and buffers) as an ArrayRecord."""
    return ArrayRecord({k: Array(v) for k, v in get_state(model).items()})


def arrays_to_model(model: nn.Module, arrays: ArrayRecord) -> nn.Module:
    """Load an ArrayRecord into `model` (keys and shapes must match)."""
    set_state(model, {k: v.numpy() for k, v in arrays.items()})
    return model


def pack_models(states: list[dict[str, np.ndarray]], skip: int | None = None) -> ArrayRecord:
    """Several model states -> one ArrayRecord with keys m<j>.<name> (model `skip` left out)."""
    return ArrayRecord({f"m{j}.{k}": Array(np.asarray(v)) for j, st in enumerate(states) if j != skip for k, v in st.items()})


def unpack_models(arrays: ArrayRecord, num_models: int) -> list[dict[str, np.ndarray]]:
    """Inverse of :func:`pack_models`; a model that was left out comes back as an empty dict."""
    states: list[dict[str, np.ndarray]] = [{} for _ in range(num_models)]
    for key, arr in arrays.items():
        j, name = key.split(".", 1)
        states[int(j[1:])][name] = arr.numpy()
    return states


def node_partition(context: Context) -> tuple[int, int]:
    """(partition-id, num-partitions) from the node config (simulation and deployment alike)."""
    nc = context.node_config
    try:
        pid, n = int(nc["partition-id"]), int(nc["num-partitions"])
    except KeyError as err:
        raise KeyError(
            f"node config lacks {err}: start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<n>\""
        ) from err
    if not 0 <= pid < n:
        raise ValueError(f"node config partition-id={pid} out of range [0, {n})")
    return pid, n


def model_inputs(data: ArrayData, cfg: dict[str, Any]) -> ArrayData:
    """Images as they are; texts tokenized for the configured text model (memoized per process)."""
    if DATASETS[cfg["dataset"]].kind != "text":
        return data
    key = (id(data), cfg["text-model"], cfg["text-max-length"])
    if key not in _TOKENIZED:
        from .text import tokenize

        _TOKENIZED[key] = (data, ArrayData(tokenize(data.x, cfg["text-model"], cfg["text-max-length"]), data.y))
    return _TOKENIZED[key][1]


_TOKENIZED: dict[tuple, tuple[ArrayData, ArrayData]] = {}  # keeps the source alive so id() stays unique


def client_data(context: Context, cfg: dict[str, Any]) -> ArrayData:
    """This node's training partition (tokenized for text)."""
    pid, n = node_partition(context)
    return model_inputs(load_partition(DataSpec.from_config(cfg, n), pid, cfg["cache-dir"]), cfg)


def test_data(cfg: dict[str, Any]) -> ArrayData:
    """The centralized test split (optionally truncated by max-test-samples; tokenized for text)."""
    data = load_test(cfg["dataset"], cfg["data-source"], cfg["data-dir"], cfg["cache-dir"], cfg["partition-seed"])
    m = cfg["max-test-samples"]
    return model_inputs(ArrayData(data.x[:m], data.y[:m]) if m else data, cfg)


def round_lr(cfg: dict[str, Any], server_round: int) -> float:
    """Local lr in a round: lr * lr-decay ** floor((round - 1) / lr-decay-every) (SHEFL: x0.99 every 10 rounds)."""
    return cfg["lr"] * cfg["lr-decay"] ** ((max(server_round, 1) - 1) // cfg["lr-decay-every"])


def local_train(model: nn.Module, data: ArrayData, cfg: dict[str, Any], server_round: int, *,
                steps: int | None = None, epochs: int | None = None, proximal_mu: float = 0.0,
                seed_offset: int = 0) -> TrainResult:
    """Run the one training loop with the config's hyper-parameters (overridable steps/epochs)."""
    torch.set_num_threads(cfg["client-threads"])
    return train(
        model, data, Normalizer(cfg["dataset"]),
        steps=cfg["local-steps"] if steps is None else steps,
        epochs=cfg["local-epochs"] if epochs is None else epochs,
        batch_size=cfg["batch-size"], lr=round_lr(cfg, server_round), momentum=cfg["momentum"],
        weight_decay=cfg["weight-decay"], optimizer=cfg["optimizer"], lr_schedule=cfg["lr-schedule"],
        proximal_mu=proximal_mu, seed=cfg["seed"] * 1_000_003 + server_round * 1009 + seed_offset,
    )


def centralized_evaluator(cfg: dict[str, Any]) -> Callable[[nn.Module], tuple[float, float]]:
    """A function model -> (loss, accuracy) on the centralized test split."""
    data = test_data(cfg)
    norm = Normalizer(cfg["dataset"])
    return lambda model: evaluate(model, data, norm, cfg["eval-batch-size"])


def dataset_threshold(cfg: dict[str, Any]) -> float:
    """Convergence threshold: the config's, else the dataset's (SHEFL: MNIST 90, FMNIST 80, ...)."""
    return cfg["convergence-threshold"] or DATASETS[cfg["dataset"]].threshold


def query_nodes(grid, cfg: dict[str, Any], message_type: str, timeout: float = 600.0) -> tuple[dict[int, Any], int]:
    """Wait for min-available-nodes, send each node a `message_type` query; ({node: reply config}, #nodes asked)."""
    from flwr.app import ConfigRecord, Message, RecordDict

    nodes = wait_for_nodes(grid, cfg["min-available-nodes"], timeout)
    msgs = [Message(RecordDict({"config": ConfigRecord({})}), message_type=message_type, dst_node_id=n) for n in nodes]
    answers = {int(r.metadata.src_node_id): r.content["config"]
               for r in grid.send_and_receive(msgs, timeout=cfg["round-timeout"]) if not r.has_error()}
    return answers, len(nodes)


def wait_for_nodes(grid, min_nodes: int, timeout: float = 600.0) -> list[int]:
    """Block until at least `min_nodes` SuperNodes are connected; return their ids (sorted)."""
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < min_nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} nodes connected; min-available-nodes = {min_nodes}")
        time.sleep(1.0)
    return nodes
