"""Glue from a validated run config to data, models, local training and evaluation.

Shared by every method's ServerApp and ClientApp so that each app only adds what its
paper adds. Nothing here talks to the network.
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context
from torch import nn

from hetfl.data import info as data_info
from hetfl.data.arrays import ArrayData
from hetfl.data.byo import LocalDataError, content_client_id, is_byo
from hetfl.data.catalog import DatasetInfo
from hetfl.data.load import load_eval, load_local_data, load_partition
from hetfl.data.spec import DataSpec

from .config import validate
from .costs import step_flops
from .fleet import tiers_of
from .models import build_model, get_state, set_state
from .nodeconfig import NodeProfile
from .params import LocalSGDParams
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


_VALIDATED: dict[tuple, dict[str, Any]] = {}


def _validated(run_id: int, run_config: Any) -> dict[str, Any]:
    """The run config validated once per run and process (a simulated ClientApp answers many messages of one run;
    a deployed one is a process per message): a copy of the first validation of the same run id and values."""
    items = dict(run_config)
    memo = (run_id, tuple(sorted((k, repr(v)) for k, v in items.items())))
    if memo not in _VALIDATED:
        if len(_VALIDATED) >= 8:  # a few runs at a time; the oldest goes
            _VALIDATED.pop(next(iter(_VALIDATED)))
        _VALIDATED[memo] = validate(items)
    return dict(_VALIDATED[memo])


def config_of(context: Context, msg=None) -> dict[str, Any]:
    """The validated run config of a ServerApp/ClientApp context.

    On a SuperNode with a ``data-path`` whose run brings its own dataset (``hub:``/``dir:``), the node does not read
    the server's reference: the run's classes (by name), input shape and normalisation come with the message
    (`msg`'s :data:`~hetfl.data.info.RUN_DATA` record) and the node's own data is described for them, so that
    the model, the labels and the data checks of this process follow the run (docs/node-data.md#labels).

    Raises
    ------
    LocalDataError
        That node's data cannot be read or describes no classification dataset.
    """
    cfg = _validated(context.run_id, context.run_config)
    path = NodeProfile(context.node_config).data_path
    if path and is_byo(cfg["dataset"]):
        run = None
        if msg is not None and data_info.RUN_DATA in msg.content:
            run = data_info.from_run_description(dict(msg.content[data_info.RUN_DATA]))
        data_info.describe_from_directory(str(path), cfg["dataset"], cfg["input-column"], cfg["label-column"],
                                          cfg["num-classes"], node_data_where(str(path), context), run=run)
    return cfg


def dataset_info(cfg: dict[str, Any]) -> DatasetInfo:
    """The run's dataset: a named dataset's table entry, or the description of a ``hub:``/``dir:`` reference
    (:func:`hetfl.data.info.dataset_info`; docs/bring-your-own.md)."""
    return data_info.dataset_info(cfg["dataset"], cfg["input-column"], cfg["label-column"], cfg["num-classes"])


def num_classes(cfg: dict[str, Any]) -> int:
    return dataset_info(cfg).num_classes


def model_input_shape(cfg: dict[str, Any]) -> tuple[int, ...]:
    """What one example looks like to the model: (C, H, W) images, or (text-max-length,) token ids."""
    info = dataset_info(cfg)
    return tuple(info.shape) if info.kind != "text" else (cfg["text-max-length"],)


def inference_flops(model: nn.Module, cfg: dict[str, Any], n: int) -> int:
    """FLOPs of `model` predicting `n` examples of the run's dataset: one forward pass each
    (:func:`~hetfl.common.costs.step_flops` of one example, times `n`: matmuls and convolutions are linear in the batch)."""
    dtype = torch.long if dataset_info(cfg).kind == "text" else torch.float32
    return n * step_flops(model, model_input_shape(cfg), 1, train=False, dtype=dtype)


def make_model(cfg: dict[str, Any], width: float | None = None, seed: int | None = None) -> nn.Module:
    """The configured model, initialised deterministically from `seed` (default: the config's).

    ``model`` is a registry name or an import path ``package.module:function`` called as
    ``function(num_classes, input_shape)`` (:func:`model_input_shape`; docs/bring-your-own.md).
    """
    seed = cfg["seed"] if seed is None else seed
    info = dataset_info(cfg)
    if cfg["model"] == "text":
        from .text import build_text_model

        return build_text_model(cfg["text-model"], info.num_classes, seed)
    torch.manual_seed(seed)
    return build_model(cfg["model"], info.num_classes, model_input_shape(cfg), cfg["width"] if width is None else width)


_RECEIVED: dict[tuple, nn.Module] = {}


def received_model(cfg: dict[str, Any], arrays: ArrayRecord) -> nn.Module:
    """The configured model holding the received `arrays` (every parameter and buffer comes from them).

    Building and initialising a model only to overwrite it costs about 15 ms for the FMNIST CNN, a
    quarter of a light round's local training, so each process builds the structure once per
    (model, dataset, width) and reloads it for every message. The global torch RNG (dropout) is
    reseeded with the run's seed, as building the model did.
    """
    key = (cfg["model"], cfg["dataset"], cfg["width"], cfg["text-model"], cfg["input-column"], cfg["label-column"],
           cfg["num-classes"], cfg["text-max-length"])
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


def packed_key(key: str) -> tuple[int, str] | None:
    """(model j, parameter name) of a :func:`pack_models` key ``m<j>.<name>``; None for any other key."""
    head, dot, name = key.partition(".")
    return (int(head[1:]), name) if dot and head[:1] == "m" and head[1:].isdigit() else None


def unpack_models(arrays: ArrayRecord, num_models: int) -> list[dict[str, np.ndarray]]:
    """Inverse of :func:`pack_models`; a model that was left out comes back as an empty dict."""
    states: list[dict[str, np.ndarray]] = [{} for _ in range(num_models)]
    for key, arr in arrays.items():
        parsed = packed_key(key)
        if parsed is None:
            raise ValueError(f"array {key!r} is not a packed model's m<j>.<name>")
        states[parsed[0]][parsed[1]] = arr.numpy()
    return states


def node_partition(context: Context) -> tuple[int, int]:
    """(partition-id, num-partitions) from the node config (simulation and deployment alike)."""
    nc = context.node_config
    try:
        pid, n = int(nc["partition-id"]), int(nc["num-partitions"])
    except KeyError as err:
        raise KeyError(
            f"node config lacks {err}: start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<n>\" (or 'data-path=\"<dir>\"' for data of its own)"
        ) from err
    if not 0 <= pid < n:
        raise ValueError(f"node config partition-id={pid} out of range [0, {n})")
    return pid, n


def node_data_where(path: str, context: Context | None = None) -> str:
    """How errors name a node's data (:class:`~hetfl.data.byo.LocalDataError` messages start with it): the client
    id it serves (with `context`) and the path."""
    if context is None:
        return f"node data-path {path!r}"
    try:
        return f"client {node_client_id(context)}: node data-path {path!r}"
    except Exception:  # noqa: BLE001 - an unreadable directory has no content id: the data error says why
        return f"node data-path {path!r}"


def node_client_id(context: Context) -> int:
    """This node's client id: node config ``client-id`` if given, else ``partition-id``, else, for a node with a
    ``data-path``, an id derived from its data's content (:func:`hetfl.data.byo.content_client_id`: the first
    31 bits of the SHA-256 of the directory's files). docs/node-data.md

    Raises
    ------
    KeyError
        The node config has none of ``client-id``, ``partition-id`` and ``data-path``.
    ValueError
        ``client-id`` is not a non-negative integer.
    """
    nc = context.node_config
    if "client-id" in nc:
        raw = nc["client-id"]
        if isinstance(raw, bool) or not (isinstance(raw, int) or (isinstance(raw, str) and raw.strip().isdigit())) \
                or int(raw) < 0:
            raise ValueError(f"node config client-id={raw!r}; expected a non-negative integer")
        return int(raw)
    if "partition-id" in nc:
        return int(nc["partition-id"])
    if (path := NodeProfile(nc).data_path) is not None:
        if not Path(path).is_dir():
            raise LocalDataError(f"{node_data_where(path)}: no such directory; expected a directory written by "
                                 "Dataset.save_to_disk or an image folder")
        return content_client_id(path)
    raise KeyError("node config lacks a client id: start the SuperNode with --node-config \"partition-id=<i> "
                   "num-partitions=<n>\" (a partition of the run's dataset) or 'data-path=\"<dir>\"' (data of its own; "
                   "optionally client-id=<int>)")


def model_inputs(data: ArrayData, cfg: dict[str, Any]) -> ArrayData:
    """Images as they are; texts tokenized for the configured text model (memoized per process)."""
    if dataset_info(cfg).kind != "text":
        return data
    key = (id(data), cfg["text-model"], cfg["text-max-length"])
    if key not in _TOKENIZED:
        from .text import tokenize

        _TOKENIZED[key] = (data, ArrayData(tokenize(data.x, cfg["text-model"], cfg["text-max-length"]), data.y))
    return _TOKENIZED[key][1]


_TOKENIZED: dict[tuple, tuple[ArrayData, ArrayData]] = {}  # keeps the source alive so id() stays unique


def device_value(context: Context, cfg: dict[str, Any], client: int, name: str) -> Any:
    """A client's device-profile value `name` (SHEFL's ``device-class``, AdaptiveFL's ``capacity``): what its node
    declares (a real device), else its tier's in the run's ``fleet`` (simulation), else None (the method draws it)."""
    value = NodeProfile(context.node_config).device(name)
    if value is None and (tiers := tiers_of(cfg, num_clients(context, cfg))) is not None:
        value = tiers[client].node_config().get(name)
    return value


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


def _single_client(nc) -> bool:
    """Whether a node is one client named by :func:`node_client_id` (data of its own, a declared id, no partition)."""
    return NodeProfile(nc).own_data or "client-id" in nc or "partition-id" not in nc


def node_clients(context: Context, cfg: dict[str, Any]) -> list[int]:
    """The client ids this node hosts (what it answers to discovery).

    A node with data of its own (``data-path``) or a declared ``client-id`` is one client
    (:func:`node_client_id`); a node that holds a partition of the run's dataset hosts its
    partition id, or with ``num-clients`` > 0 its share of the clients (:func:`hosted_clients`).
    """
    if _single_client(context.node_config):
        return [node_client_id(context)]
    pid, n = node_partition(context)
    return hosted_clients(pid, n, cfg["num-clients"])


def message_client(msg, context: Context, cfg: dict[str, Any]) -> int:
    """The client id a message is for: its ``client`` record (a client this node hosts), else the node's one client.

    Raises
    ------
    ValueError
        The message names a client this node does not host, or names none on a node that hosts several.
    """
    if "client" in msg.content:
        client = int(msg.content["client"]["client-id"])
        if _single_client(context.node_config) or not cfg["num-clients"]:
            hosted = client in node_clients(context, cfg)
        else:  # round robin: no list of thousands of ids per message
            pid, n = node_partition(context)
            hosted = 0 <= client < cfg["num-clients"] and client % n == pid
        if not hosted:
            raise ValueError(f"message for client {client}, which this SuperNode does not host "
                             f"(it hosts {node_clients(context, cfg)[:5]}...)")
        return client
    clients = node_clients(context, cfg)
    if len(clients) != 1:
        raise ValueError(f"message names no client and this node hosts {len(clients)}")
    return clients[0]


def state_key(client: int, name: str) -> str:
    """The node-state (``Context.state``) key of a client's record `name`: each hosted client keeps its own."""
    return f"{name}@{int(client)}"


def client_data(context: Context, cfg: dict[str, Any], client_id: int | None = None) -> ArrayData:
    """The training data of client `client_id` on this node (tokenized for text).

    A node whose node config names a ``data-path`` trains on that directory and nothing else (the run's dataset is
    never read there); otherwise the client's partition of the run's dataset, split into ``num-clients`` partitions
    (or ``num-partitions`` from the node config when 0: simulation, and deployments that rehearse a split).
    docs/node-data.md

    Parameters
    ----------
    client_id : int, optional
        The logical client whose data to load (default: :func:`node_client_id`). A node with a ``data-path`` holds
        one client: its own.

    Raises
    ------
    LocalDataError
        The node's ``data-path`` is missing, unreadable or does not fit the run (shape, channels, labels outside
        [0, num-classes), missing columns, no rows); one line naming the path, what was found and what is expected.
    """
    nc = context.node_config
    if (path := NodeProfile(nc).data_path) is not None:
        if client_id is not None and client_id != node_client_id(context):
            raise ValueError(f"{node_data_where(path)} holds the data of client {node_client_id(context)}, "
                             f"not of client {client_id}")
        data = load_local_data(path, dataset_info(cfg), node_data_where(path, context), "train", cfg["cache-dir"])
        return model_inputs(data, cfg)
    if "num-partitions" not in nc:
        raise KeyError("node config lacks 'num-partitions': start the SuperNode with --node-config "
                       "\"partition-id=<i> num-partitions=<n>\" (or 'data-path=\"<dir>\"' for data of its own)")
    cid = node_client_id(context) if client_id is None else int(client_id)
    return model_inputs(load_partition(DataSpec.from_config(cfg, num_clients(context, cfg)), cid, cfg["cache-dir"]), cfg)


def eval_splits(cfg: dict[str, Any]) -> tuple[ArrayData | None, ArrayData]:
    """(validation, test) from the server's evaluation set (truncated by max-test-samples; tokenized for text).

    The evaluation set is ``server-data-path`` when set (a directory on the server host), else the dataset's
    test split (:func:`hetfl.data.load.load_eval`).
    ``eval-split = "test-half"`` (FENS Sec. 3.1): the first half is validation, accuracy is
    reported on the second half; ``"all"``: no validation, the whole split is the test set.
    Every method of one comparison uses the same key, so they are scored on the same images.
    """
    data = load_eval(DataSpec.from_config(cfg, 1), cfg["cache-dir"])
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
    return LocalSGDParams.from_config(cfg).lr_at(server_round)


def client_device(cfg: dict[str, Any]) -> torch.device:
    """The device of local training and of client-side logits (run-config `torch-device`; docs/training.md)."""
    return resolve_device(cfg["torch-device"], "torch-device")


def server_device(cfg: dict[str, Any]) -> torch.device:
    """The device of server-side evaluation (run-config `server-torch-device`, '' = `torch-device`)."""
    return resolve_device(cfg["server-torch-device"], "server-torch-device") if cfg["server-torch-device"] else client_device(cfg)


def compute_options(cfg: dict[str, Any], server: bool = False) -> dict[str, Any]:
    """Keyword arguments `device` and `precision` for evaluate / predict_proba / member_logits / train."""
    return {"device": server_device(cfg) if server else client_device(cfg), "precision": cfg["precision"]}


def local_train(model: nn.Module, data: ArrayData, cfg: dict[str, Any], server_round: int, *,
                steps: int | None = None, epochs: int | None = None, proximal_mu: float = 0.0,
                seed_offset: int = 0, loss_fn: Callable[..., torch.Tensor] | None = None,
                normalize: Normalizer | None = None, epoch_end: Callable[[int], bool | None] | None = None) -> TrainResult:
    """Run the one training loop with the config's hyper-parameters (overridable steps/epochs) on `torch-device`;
    batches normalised with the dataset's statistics unless `normalize` says otherwise."""
    torch.set_num_threads(cfg["client-threads"])
    return train(
        model, data, Normalizer(dataset_info(cfg)) if normalize is None else normalize,
        steps=cfg["local-steps"] if steps is None else steps,
        epochs=cfg["local-epochs"] if epochs is None else epochs,
        batch_size=cfg["batch-size"], lr=round_lr(cfg, server_round), momentum=cfg["momentum"],
        weight_decay=cfg["weight-decay"], optimizer=cfg["optimizer"], lr_schedule=cfg["lr-schedule"],
        lr_min=cfg["lr-min"], proximal_mu=proximal_mu, seed=cfg["seed"] * 1_000_003 + server_round * 1009 + seed_offset,
        augment=cfg["augment"], drop_last=cfg["drop-last"], loss_fn=loss_fn, epoch_end=epoch_end, **compute_options(cfg),
    )


def centralized_evaluators(cfg: dict[str, Any]) -> tuple[Callable[[nn.Module], tuple[float, float]],
                                                          Callable[[nn.Module], tuple[float, float]] | None]:
    """Functions model -> (loss, accuracy) on the server's test split and on its validation half (None when
    ``eval-split = "all"`` leaves none; see :func:`eval_splits`), on `server-torch-device`; the set is loaded once."""
    val, test = eval_splits(cfg)
    norm = Normalizer(dataset_info(cfg))
    opts = compute_options(cfg, server=True)

    def on(data: ArrayData) -> Callable[[nn.Module], tuple[float, float]]:
        return lambda model: evaluate(model, data, norm, cfg["eval-batch-size"], **opts)

    return on(test), (on(val) if val is not None else None)


def dataset_threshold(cfg: dict[str, Any]) -> float:
    """Convergence threshold: the config's, else the dataset's (SHEFL: MNIST 90, FMNIST 80, ...)."""
    return cfg["convergence-threshold"] or dataset_info(cfg).threshold
