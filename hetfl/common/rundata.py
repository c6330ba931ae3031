"""The run's data as a ClientApp or ServerApp sees it: the dataset's facts, a hosted client's training data (a
partition of the run's dataset, or a node's own directory), and the server's validation and test sets
(docs/node-data.md, docs/running.md#data). Loading itself is :mod:`hetfl.data`.
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context

from hetfl.data import info as data_info
from hetfl.data.arrays import ArrayData
from hetfl.data.catalog import DatasetInfo
from hetfl.data.load import load_eval, load_local_data, load_partition
from hetfl.data.spec import DataSpec

from .hosting import node_client_id, node_data_where, num_clients
from .nodeconfig import NodeProfile


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


def dataset_threshold(cfg: dict[str, Any]) -> float:
    """Convergence threshold: the config's, else the dataset's (SHEFL: MNIST 90, FMNIST 80, ...)."""
    return cfg["convergence-threshold"] or dataset_info(cfg).threshold
