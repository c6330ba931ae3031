"""What a run's dataset is in this process: a named dataset's :data:`~hetfl.data.catalog.DATASETS` entry, or the
description of a reference, remembered per process (every app describes its run's dataset before it normalises a
batch; :func:`info_by_name` then finds it by the run-config ``dataset`` alone).

A SuperNode with a ``data-path`` never reads the server's reference: the server sends its description with every
message (:data:`RUN_DATA`, :func:`run_description`) and the node describes its own data for it
(:func:`describe_from_directory`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .byo import BYO_NORM, BYO_THRESHOLD, choose_split, describe, is_byo, read_directory, read_reference
from .catalog import DATASETS, DatasetInfo

_DESCRIBED: dict[tuple[str, str, str, int], DatasetInfo] = {}  # (dataset, input-column, label-column, num-classes)
_BY_NAME: dict[str, DatasetInfo] = {}  # dataset -> its latest description in this process (Normalizer by name)


def dataset_info(name: str, input_col: str = "", label_col: str = "", num_classes: int = 0) -> DatasetInfo:
    """The :class:`DatasetInfo` of a run-config ``dataset`` (with ``input-column``, ``label-column``, ``num-classes``).

    A named dataset: its entry of :data:`DATASETS` (the column keys are '' or its own, which validation checks).
    A reference (``hub:``/``dir:``): :func:`describe` of its train split, memoized per process; a node that holds
    only its own data gives the description of that data instead (:func:`adopt_description`).

    Raises
    ------
    KeyError
        Neither a name of :data:`DATASETS` nor a reference.
    LocalDataError, DatasetUnavailable
        The reference cannot be read or does not describe a classification dataset.
    """
    if not is_byo(name):
        return DATASETS[name]
    key = (name, input_col, label_col, int(num_classes))
    if key not in _DESCRIBED:
        where = f"run-config key 'dataset' = {name!r}"
        train = choose_split(read_reference(name), "train", where)
        adopt_description(key, describe(train, name, input_col, label_col, num_classes, where))
    return _DESCRIBED[key]


def adopt_description(key: tuple[str, str, str, int], info: DatasetInfo) -> None:
    """Use `info` as this process's description of the run's dataset `key` = (dataset, input-column, label-column,
    num-classes)."""
    _DESCRIBED[key] = info
    _BY_NAME[key[0]] = info


def describe_from_directory(path: str | Path, name: str, input_col: str, label_col: str, num_classes: int,
                            where: str, run: DatasetInfo | None = None) -> DatasetInfo:
    """Describe the reference `name` from a node's own data directory and adopt it for this process (once).

    A SuperNode with a ``data-path`` never reads the server's ``hub:``/``dir:`` reference. With `run` (the
    description the server sends with every message, :func:`run_description`) its classes, input shape and
    normalisation are the run's and its own data is checked against them; without it (an older server) they follow
    its own train split (:func:`describe`). docs/bring-your-own.md

    Raises
    ------
    LocalDataError
        The directory cannot be read or describes no classification dataset; the message starts with `where`.
    """
    key = (name, input_col, label_col, int(num_classes))
    where_key = (str(Path(path).resolve()), key)
    if run is None:  # a later call of the same message's ClientApp (no message at hand): the run it was given
        run = _NODE_RUN.get(where_key)
    _NODE_RUN[where_key] = run
    node_key = (*where_key, run)
    if node_key not in _NODE_DESCRIBED:  # per directory and run description: several nodes may share a process
        train = choose_split(read_directory(path, where), "train", where)
        _NODE_DESCRIBED[node_key] = describe(train, *key, where=where, run=run)
    adopt_description(key, _NODE_DESCRIBED[node_key])  # this node's description is the process's until the next
    return _DESCRIBED[key]


_NODE_DESCRIBED: dict[tuple, DatasetInfo] = {}  # (node data directory, run key, run description) -> description
_NODE_RUN: dict[tuple, DatasetInfo | None] = {}  # (node data directory, run key) -> the run description last given


RUN_DATA = "run-data"
"""Record of every message of a ``hub:``/``dir:`` run: the server's description of the run's data."""


def run_description(info: DatasetInfo) -> dict[str, Any]:
    """What the server tells nodes about a bring-your-own dataset (a ConfigRecord's fields): the classes by name,
    their count, the kind of input and the image shape. A node that holds only its own data cannot know them."""
    out = {"class-names": list(info.class_names), "num-classes": int(info.num_classes), "kind": info.kind,
           "shape": [int(v) for v in info.shape]}
    if info.kind == "tabular":  # a table's columns and the server's standardisation, the same on every node
        out.update(features=list(info.features), mean=[float(v) for v in info.mean], std=[float(v) for v in info.std])
    return out


def from_run_description(fields: dict[str, Any]) -> DatasetInfo:
    """The run's :class:`DatasetInfo` from :func:`run_description` (columns are filled in from the node's data)."""
    shape = tuple(int(v) for v in fields.get("shape", []))
    names = tuple(str(n) for n in fields.get("class-names", []))
    if str(fields["kind"]) == "tabular":
        return DatasetInfo("", "", "", int(fields["num-classes"]), shape, tuple(float(v) for v in fields["mean"]),
                           tuple(float(v) for v in fields["std"]), BYO_THRESHOLD, kind="tabular", class_names=names,
                           features=tuple(str(f) for f in fields["features"]))
    norm = (BYO_NORM,) * shape[0] if shape else ()
    return DatasetInfo("", "", "", int(fields["num-classes"]), shape, norm, norm, BYO_THRESHOLD,
                       kind=str(fields["kind"]), class_names=names)


def info_by_name(name: str) -> DatasetInfo:
    """:class:`DatasetInfo` by the run-config ``dataset`` alone: the table, or the reference's latest description in
    this process (every app describes its run's dataset before it normalises a batch)."""
    if not is_byo(name):
        return DATASETS[name]
    if name not in _BY_NAME:
        raise LookupError(f"dataset {name!r} has not been described in this process; call dataset_info() with the "
                          "run config's input-column, label-column and num-classes first")
    return _BY_NAME[name]
