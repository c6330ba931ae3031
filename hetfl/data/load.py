"""A run's data as cached arrays: a client's partition (:func:`load_partition`), the server's evaluation set
(:func:`load_eval`, :func:`load_test`) and held-out set (:func:`load_server_set`), a directory of one's own
(:func:`load_local_data`), each built once and cached (:func:`~hetfl.data.cache.cached`).

Two sources give the same partitions:

* ``hub``: :class:`flwr_datasets.FederatedDataset` downloads the dataset, shuffles it with ``partition-seed`` and
  hands the train split to the partitioner.
* ``local``: the same splits as arrays in the hub's row order, from local files (:mod:`hetfl.data.readers`), a
  ``save_to_disk`` directory in ``data-dir`` or a ``hub:``/``dir:`` reference. Their row index
  (:func:`~hetfl.data.arrays.row_index`) is shuffled with the same seed and given to the same flwr-datasets
  partitioner; the rows it picks are taken from the arrays.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from .arrays import ROW, ArrayData, row_index, take
from .byo import (
    LocalDataError,
    choose_split,
    is_byo,
    one_label_column,
    read_directory,
    read_reference,
    reference_token,
    stat_signature,
    unreadable,
)
from .cache import cache_root, cached
from .catalog import DATASETS, DatasetInfo, DatasetUnavailable
from .convert import from_hf, to_arrays, to_hf
from .info import dataset_info
from .readers import local_available, local_dirs, read_local
from .spec import DataSpec


def _cache_name(name: str) -> str:
    """Directory of a dataset under the cache root: its name, or ``byo-<hash>`` for a reference."""
    return f"byo-{hashlib.sha1(name.encode()).hexdigest()[:12]}" if is_byo(name) else name


def _resolve_source(spec: DataSpec) -> str:
    if is_byo(spec.dataset):  # read once into arrays (hub: through the datasets cache), then as local files
        return "local"
    if spec.source != "auto":
        return spec.source
    return "local" if local_available(spec.dataset, spec.data_dir) else "hub"


@lru_cache(maxsize=4)
def local_arrays(name: str, data_dir: str = "") -> tuple[ArrayData, ArrayData]:
    """The local (train, test) splits as arrays, in the hub's row order (not yet shuffled)."""
    saved = Path(data_dir) / name if data_dir else None
    if saved is not None and (saved / "dataset_dict.json").exists():
        from datasets import load_from_disk

        dd = load_from_disk(str(saved))
        return from_hf(name, dd["train"]), from_hf(name, dd["test"])
    arrays = read_local(name, data_dir)
    if arrays is None:
        raise DatasetUnavailable(
            f"dataset '{name}' not found in local files (searched {[str(d) for d in local_dirs(name, data_dir)] or 'no existing directory'}). "
            f"To get it: {DATASETS[name].how_to_get}; or use data-source = 'hub' with internet access."
        )
    return arrays


@lru_cache(maxsize=4)
def _reference_arrays(name: str, input_col: str, label_col: str, num_classes: int, token: str
                      ) -> tuple[ArrayData, ArrayData | None]:
    """(train, test or None) of a reference as arrays in its own row order; `token` (:func:`reference_token`)
    renews the memo when a directory's content changes."""
    info = dataset_info(name, input_col, label_col, num_classes)
    dd = read_reference(name)
    where = f"run-config key 'dataset' = {name!r}"
    train = to_arrays(choose_split(dd, "train", where), info, f"{where} (split 'train')", allow_empty=False)
    test = to_arrays(dd["test"], info, f"{where} (split 'test')", allow_empty=False) if "test" in dd and len(dd) > 1 else None
    return train, test


def source_arrays(spec: DataSpec) -> tuple[ArrayData, ArrayData | None]:
    """The unshuffled (train, test) arrays that partitions and the test split are taken from: a named dataset's local
    files or a reference (whose test split may be missing: None)."""
    if is_byo(spec.dataset):
        return _reference_arrays(spec.dataset, spec.input_col, spec.label_col, spec.num_classes,
                                 reference_token(spec.dataset))
    return local_arrays(spec.dataset, spec.data_dir)


def local_datasetdict(name: str, data_dir: str = ""):
    """The local splits as a DatasetDict with the hub's columns and row order (not yet shuffled)."""
    from datasets import DatasetDict

    train, test = local_arrays(name, data_dir)
    return DatasetDict({"train": to_hf(name, train), "test": to_hf(name, test)})


def _to_arrays(spec: DataSpec, ds) -> ArrayData:
    """A partition or split (hub rows, or a row index of the local train split) as arrays."""
    if ROW not in ds.column_names:
        return to_arrays(ds, spec.info, f"dataset {spec.dataset!r}")
    return take(source_arrays(spec)[0], ds)


@lru_cache(maxsize=4)
def _partitioner_for(spec: DataSpec):
    """A partitioner with its dataset assigned (local) or a FederatedDataset (hub)."""
    from .partition import make_partitioner  # flwr-datasets, and with it `datasets`, load with the first partition

    if _resolve_source(spec) == "hub":
        info = DATASETS[spec.dataset]
        if not info.hub_id:
            raise DatasetUnavailable(f"dataset '{spec.dataset}' has no hub version; {info.how_to_get}")
        from flwr_datasets import FederatedDataset

        # shard size needs the train length: FederatedDataset loads lazily, so build a probe first
        probe = FederatedDataset(dataset=info.hub_id, subset=info.subset, partitioners={"train": 1}, shuffle=True, seed=spec.seed)
        try:
            n_train = len(probe.load_split("train"))
        except Exception as err:  # network/hub errors come in many types
            raise DatasetUnavailable(
                f"dataset '{spec.dataset}' could not be loaded from the Hugging Face hub ({info.hub_id}): {err}. "
                f"Offline: {info.how_to_get}, and set data-source = 'local'."
            ) from err
        if not spec.server_holdout and spec.train_fraction == 1.0:
            return FederatedDataset(
                dataset=info.hub_id, subset=info.subset,
                partitioners={"train": make_partitioner(spec, n_train)}, shuffle=True, seed=spec.seed,
            )
        return FederatedDataset(  # the shuffled rows: the server's holdout first, then the clients' share
            dataset=info.hub_id, subset=info.subset, preprocessor=_divider(spec, n_train),
            partitioners={"clients": make_partitioner(spec, _clients_rows(spec, n_train))}, shuffle=True,
            seed=spec.seed,
        )
    # exactly what FederatedDataset does with the hub's DatasetDict: shuffle every split with the seed
    train = _local_train_splits(spec)[0]
    part = make_partitioner(spec, len(train))
    part.dataset = train
    return part


def _clients_rows(spec: DataSpec, n_train: int) -> int:
    """How many train rows the clients partition: `train_fraction` of those the server does not hold out (>= 1)."""
    return max(1, round(spec.train_fraction * (n_train - spec.server_holdout)))


def _divider(spec: DataSpec, n_train: int):
    """flwr-datasets Divider of the shuffled train split: its first `server_holdout` rows -> 'server', the next
    `train_fraction` of the rest -> 'clients', what remains -> 'unused' (dropped)."""
    from flwr_datasets.preprocessor import Divider

    if spec.server_holdout and not 0 < spec.server_holdout < n_train:
        raise ValueError(f"server-holdout = {spec.server_holdout}: expected 0 < n < {n_train} (the train split's size)")
    k = _clients_rows(spec, n_train)
    parts = {"server": spec.server_holdout, "clients": k, "unused": n_train - spec.server_holdout - k}
    return Divider(divide_config={s: n for s, n in parts.items() if n}, divide_split="train",
                   drop_remaining_splits=True)


def _local_train_splits(spec: DataSpec):
    """(clients' train split, server's held-out split or None) from local files, as FederatedDataset makes them."""
    from datasets import DatasetDict

    train = row_index(spec.info, source_arrays(spec)[0]).shuffle(seed=spec.seed)
    if not spec.server_holdout and spec.train_fraction == 1.0:
        return train, None
    dd = _divider(spec, len(train))(DatasetDict({"train": train}))
    return dd["clients"], dd["server"] if spec.server_holdout else None


SERVER_SPLITS = ("test", "holdout")  # the splits of a server-data-path directory (python -m hetfl.export writes both)


def load_server_set(spec: DataSpec, cache_dir: str = "") -> ArrayData:
    """The `server_holdout` train samples no client holds (FedBE's unlabeled server set; the server must not
    use its labels): the split ``holdout`` of ``server-data-path`` when set, else taken from the train split."""
    if not spec.server_holdout:
        raise ValueError("load_server_set: the spec holds nothing out (server-holdout = 0)")
    spec.info  # noqa: B018 - describe a reference in this process before anything reads the cache
    if spec.server_data_path:
        return load_local_data(spec.server_data_path, spec.info, f"run-config key 'server-data-path' = "
                               f"{spec.server_data_path!r}", split="holdout", cache_dir=cache_dir, strict_split=True)
    extra = "" if not is_byo(spec.dataset) else reference_token(spec.dataset) + repr(spec.info)
    tag = hashlib.sha1(f"{spec.seed}-{spec.server_holdout}-{spec.data_dir}{extra}".encode()).hexdigest()[:12]
    path = cache_root(cache_dir) / _cache_name(spec.dataset) / f"server-{tag}.npz"  # the same for any partitioning

    def build() -> ArrayData:
        if _resolve_source(spec) == "hub":
            return _to_arrays(spec, _partitioner_for(spec).load_split("server"))
        return _to_arrays(spec, _local_train_splits(spec)[1])

    return cached(path, build)


def load_partition(spec: DataSpec, partition_id: int, cache_dir: str = "") -> ArrayData:
    """Partition `partition_id` of the train split as arrays (deterministic given the spec)."""
    if not 0 <= partition_id < spec.num_partitions:
        raise ValueError(f"partition-id {partition_id} out of range [0, {spec.num_partitions})")
    path = cache_root(cache_dir) / _cache_name(spec.dataset) / spec.key() / f"part-{partition_id:05d}.npz"

    def build() -> ArrayData:
        try:
            return _to_arrays(spec, _partitioner_for(spec).load_partition(partition_id))
        except IndexError:
            if spec.partitioner != "iid" or partition_id == 0:
                raise
            # more clients than rows: IidPartitioner's contiguous shard of this id is empty, and `datasets` refuses
            # to select an empty range at the end; the client holds no data (it trains nothing and weighs 0)
            first = load_partition(spec, 0, cache_dir)
            return ArrayData(first.x[:0], first.y[:0])

    return cached(path, build)


def load_local_data(path: str | Path, info: DatasetInfo, where: str, split: str = "train", cache_dir: str = "",
                    strict_split: bool = False) -> ArrayData:
    """A directory's data (:func:`read_directory`) as arrays checked against the run's `info` (:func:`to_arrays`).

    Used for a node's ``data-path`` (split ``train``, or the directory's only split) and for ``server-data-path``
    (``test``; ``holdout``). Cached like partitions, under the directory's path, file sizes and mtimes and `info`.

    Parameters
    ----------
    where : str
        How the error message names the data, e.g. ``node data-path '/data/fmnist'``.
    strict_split : bool
        Require a split named `split` (else the directory's only split is taken too).

    Raises
    ------
    LocalDataError
        The directory is missing or unreadable, or its data does not fit `info` (empty included).
    """
    p = Path(path)
    if not p.is_dir():
        raise LocalDataError(f"{where}: no such directory; expected a directory written by Dataset.save_to_disk "
                             "or an image folder (one subfolder of images per class)")
    tag = hashlib.sha1(json.dumps([str(p.resolve()), stat_signature(p), split, repr(info)]).encode()).hexdigest()[:16]

    def build() -> ArrayData:
        dd = read_directory(p, where)
        if strict_split and split not in dd:
            raise LocalDataError(f"{where}: holds the splits {sorted(dd)}; expected a split named {split!r}")
        ds = choose_split(dd, split, where)
        one_label_column(ds, info, where)
        try:
            return to_arrays(ds, info, where, allow_empty=False)
        except LocalDataError:
            raise
        except Exception as err:  # decoded only now: an image file that is not one, a cut Arrow file
            raise unreadable(where, err) from err

    return cached(cache_root(cache_dir) / "local" / f"{tag}.npz", build)


def load_eval(spec: DataSpec, cache_dir: str = "") -> ArrayData:
    """The server's evaluation set: ``server-data-path`` (split ``test`` or its only split, in its own row order) if
    set, else the dataset's test split shuffled with the partition seed (in the hub's row order after the shuffle)."""
    info = spec.info
    if spec.server_data_path:
        return load_local_data(spec.server_data_path, info, f"run-config key 'server-data-path' = "
                               f"{spec.server_data_path!r}", split="test", cache_dir=cache_dir)
    extra = "" if not is_byo(spec.dataset) else reference_token(spec.dataset) + repr(info)  # labels checked per info
    tag = hashlib.sha1((spec.data_dir + extra).encode()).hexdigest()[:8]
    path = cache_root(cache_dir) / _cache_name(spec.dataset) / f"test-{spec.seed}-{tag}.npz"

    def build() -> ArrayData:
        if _resolve_source(spec) == "hub":
            return from_hf(spec.dataset, _partitioner_for(spec).load_split("test"))
        test = source_arrays(spec)[1]
        if test is None:
            raise LocalDataError(f"run-config key 'dataset' = {spec.dataset!r}: has no split named 'test' for the "
                                 "server's evaluation; add one, or set run-config key 'server-data-path'")
        return take(test, row_index(info, test).shuffle(seed=spec.seed))

    return cached(path, build)


def load_test(name: str, source: str = "auto", data_dir: str = "", cache_dir: str = "", seed: int = 42) -> ArrayData:
    """The centralized test split of a named dataset (in the hub's row order after the shared shuffle)."""
    spec = DataSpec(dataset=name, source=source, data_dir=data_dir, partitioner="iid", num_partitions=1, seed=seed)
    return load_eval(spec, cache_dir)
