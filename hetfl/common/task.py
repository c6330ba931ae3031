"""Glue from a validated run config to data, models, local training and evaluation.

Shared by every method's ServerApp and ClientApp so that each app only adds what its
paper adds. Nothing here talks to the network.
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context
from torch import nn

from .config import validate
from .data import DATASETS, ArrayData, DataSpec, load_partition, load_test
from .models import build_model, get_state, set_state
from .train import Normalizer, TrainResult, evaluate, resolve_device, train

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


_RECEIVED: dict[tuple, nn.Module] = {}


def received_model(cfg: dict[str, Any], arrays: ArrayRecord) -> nn.Module:
    """The configured model holding the received `arrays` (every parameter and buffer comes from them).

    Building and initialising a model only to overwrite it costs about 15 ms for the FMNIST CNN, a
    quarter of a light round's local training, so each process builds the structure once per
    (model, dataset, width) and reloads it for every message. The global torch RNG (dropout) is
    reseeded with the run's seed, as building the model did.
    """
    key = (cfg["model"], cfg["dataset"], cfg["width"], cfg["text-model"])
    if key not in _RECEIVED:
        _RECEIVED[key] = make_model(cfg)
    torch.manual_seed(cfg["seed"])
    return arrays_to_model(_RECEIVED[key], arrays)


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


def num_clients(context: Context, cfg: dict[str, Any]) -> int:
    """Clients of the federation: run-config ``num-clients``, or one per SuperNode (``num-partitions``) when 0."""
    return cfg["num-clients"] or node_partition(context)[1]


def hosted_clients(partition_id: int, num_partitions: int, num_clients: int) -> list[int]:
    """Client ids hosted by SuperNode `partition_id` of `num_partitions` (``num_clients`` 0: its partition id).

    With ``num_clients`` > 0 the clients are dealt round robin: node ``p`` hosts ``p, p + P, ...``
    (docs/architecture.md#scale).
    """
    if num_clients <= 0:
        return [int(partition_id)]
    return list(range(int(partition_id), int(num_clients), int(num_partitions)))


def node_clients(context: Context, cfg: dict[str, Any]) -> list[int]:
    """The client ids this node hosts (what it answers to discovery)."""
    pid, n = node_partition(context)
    return hosted_clients(pid, n, cfg["num-clients"])


def message_client(msg, context: Context, cfg: dict[str, Any]) -> int:
    """The client id a message is for: its ``client`` record (a client this node hosts), else the node's one client.

    Raises
    ------
    ValueError
        The message names a client this node does not host, or names none on a node that hosts several.
    """
    pid, n = node_partition(context)
    if "client" in msg.content:
        client = int(msg.content["client"]["client-id"])
        hosted = client == pid if not cfg["num-clients"] else (0 <= client < cfg["num-clients"] and client % n == pid)
        if not hosted:
            raise ValueError(f"message for client {client}, which SuperNode partition-id={pid} of {n} does not host")
        return client
    clients = node_clients(context, cfg)
    if len(clients) != 1:
        raise ValueError(f"message names no client and this node hosts {len(clients)}")
    return clients[0]


def state_key(client: int, name: str) -> str:
    """The node-state (``Context.state``) key of a client's record `name`: each hosted client keeps its own."""
    return f"{name}@{int(client)}"


def client_data(context: Context, cfg: dict[str, Any], client: int) -> ArrayData:
    """Client `client`'s training partition (tokenized for text)."""
    spec = DataSpec.from_config(cfg, num_clients(context, cfg))
    return model_inputs(load_partition(spec, client, cfg["cache-dir"]), cfg)


def eval_splits(cfg: dict[str, Any]) -> tuple[ArrayData | None, ArrayData]:
    """(validation, test) from the centralized test split (truncated by max-test-samples; tokenized for text).

    ``eval-split = "test-half"`` (FENS Sec. 3.1): the first half is validation, accuracy is
    reported on the second half; ``"all"``: no validation, the whole split is the test set.
    Every method of one comparison uses the same key, so they are scored on the same images.
    """
    data = load_test(cfg["dataset"], cfg["data-source"], cfg["data-dir"], cfg["cache-dir"], cfg["partition-seed"])
    m = cfg["max-test-samples"]
    data = model_inputs(ArrayData(data.x[:m], data.y[:m]) if m else data, cfg)
    if cfg["eval-split"] == "all":
        return None, data
    half = len(data) // 2
    return ArrayData(data.x[:half], data.y[:half]), ArrayData(data.x[half:], data.y[half:])


def test_data(cfg: dict[str, Any]) -> ArrayData:
    """The set accuracy is reported on (run-config ``eval-split``; see :func:`eval_splits`)."""
    return eval_splits(cfg)[1]


def round_lr(cfg: dict[str, Any], server_round: int) -> float:
    """Local lr in a round (1-based): lr * lr-decay ** floor((round - 1) / lr-decay-every).

    SHEFL: x0.99 every 10 rounds; AdaptiveFL authors: lr x 0.998^r with r counted from 0, i.e.
    lr-decay = 0.998, lr-decay-every = 1 (round 1 trains at lr). docs/training.md
    """
    return cfg["lr"] * cfg["lr-decay"] ** ((max(server_round, 1) - 1) // cfg["lr-decay-every"])


def client_device(cfg: dict[str, Any]) -> torch.device:
    """The device of local training and of client-side logits (run-config `device`; docs/training.md)."""
    return resolve_device(cfg["device"], "device")


def server_device(cfg: dict[str, Any]) -> torch.device:
    """The device of server-side evaluation (run-config `server-device`, '' = `device`)."""
    return resolve_device(cfg["server-device"], "server-device") if cfg["server-device"] else client_device(cfg)


def compute_options(cfg: dict[str, Any], server: bool = False) -> dict[str, Any]:
    """Keyword arguments `device` and `precision` for evaluate / predict_proba / member_logits / train."""
    return {"device": server_device(cfg) if server else client_device(cfg), "precision": cfg["precision"]}


def local_train(model: nn.Module, data: ArrayData, cfg: dict[str, Any], server_round: int, *,
                steps: int | None = None, epochs: int | None = None, proximal_mu: float = 0.0,
                seed_offset: int = 0, loss_fn: Callable[..., torch.Tensor] | None = None) -> TrainResult:
    """Run the one training loop with the config's hyper-parameters (overridable steps/epochs) on `device`."""
    torch.set_num_threads(cfg["client-threads"])
    return train(
        model, data, Normalizer(cfg["dataset"]),
        steps=cfg["local-steps"] if steps is None else steps,
        epochs=cfg["local-epochs"] if epochs is None else epochs,
        batch_size=cfg["batch-size"], lr=round_lr(cfg, server_round), momentum=cfg["momentum"],
        weight_decay=cfg["weight-decay"], optimizer=cfg["optimizer"], lr_schedule=cfg["lr-schedule"],
        lr_min=cfg["lr-min"], proximal_mu=proximal_mu, seed=cfg["seed"] * 1_000_003 + server_round * 1009 + seed_offset,
        augment=cfg["augment"], drop_last=cfg["drop-last"], loss_fn=loss_fn, **compute_options(cfg),
    )


def centralized_evaluator(cfg: dict[str, Any]) -> Callable[[nn.Module], tuple[float, float]]:
    """A function model -> (loss, accuracy) on the centralized test split, on `server-device`."""
    data = test_data(cfg)
    norm = Normalizer(cfg["dataset"])
    opts = compute_options(cfg, server=True)
    return lambda model: evaluate(model, data, norm, cfg["eval-batch-size"], **opts)


def dataset_threshold(cfg: dict[str, Any]) -> float:
    """Convergence threshold: the config's, else the dataset's (SHEFL: MNIST 90, FMNIST 80, ...)."""
    return cfg["convergence-threshold"] or DATASETS[cfg["dataset"]].threshold
