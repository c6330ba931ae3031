"""Datasets by name, from the Hugging Face hub or local files, partitioned by flwr-datasets.

Two sources give the same partitions:

* ``hub``: :class:`flwr_datasets.FederatedDataset` downloads the dataset, shuffles it
  with ``partition-seed`` and hands the train split to the partitioner.
* ``local``: the same splits are read from local files (IDX, CIFAR pickles, SVHN .mat,
  AG News CSV, a ``save_to_disk`` directory, or scikit-learn's digits) as arrays in the
  hub's row order. A :class:`datasets.Dataset` of the hub's label column and the row
  positions is shuffled with the same seed and given to the same flwr-datasets partitioner;
  the rows it picks are taken from the arrays (see :func:`_row_index`).

Partitions are converted to uint8/int64 NumPy arrays once and cached on disk
(``cache-dir``), so every ClientApp process after the first loads its partition in
milliseconds. The centralized test split is cached the same way for the ServerApp.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import pickle
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about one dataset."""

    hub_id: str
    image_col: str  # or the text column for text datasets
    label_col: str
    num_classes: int
    shape: tuple[int, ...]  # (C, H, W) for images, () for text
    mean: tuple[float, ...]
    std: tuple[float, ...]
    threshold: float  # convergence threshold (SHEFL paper)
    subset: str | None = None
    kind: str = "image"
    local_dirs: tuple[str, ...] = ()
    how_to_get: str = ""


DATASETS: dict[str, DatasetInfo] = {
    "fashion_mnist": DatasetInfo(
        "zalando-datasets/fashion_mnist", "image", "label", 10, (1, 28, 28), (0.2860,), (0.3530,), 0.80,
        local_dirs=("/usr/share/datasets/fashion-mnist",),
        how_to_get="apt-get install dataset-fashion-mnist (IDX files in /usr/share/datasets/fashion-mnist), "
        "or put train/t10k-*-idx*-ubyte[.gz] in data-dir/fashion_mnist",
    ),
    "mnist": DatasetInfo(
        "ylecun/mnist", "image", "label", 10, (1, 28, 28), (0.1307,), (0.3081,), 0.90,
        local_dirs=("/usr/share/datasets/mnist",),
        how_to_get="put the MNIST IDX files (train/t10k-*-idx*-ubyte[.gz]) in data-dir/mnist",
    ),
    "cifar10": DatasetInfo(
        "uoft-cs/cifar10", "img", "label", 10, (3, 32, 32), (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 0.70,
        how_to_get="extract cifar-10-python.tar.gz so that data-dir/cifar10/cifar-10-batches-py exists",
    ),
    "cifar100": DatasetInfo(
        "uoft-cs/cifar100", "img", "fine_label", 100, (3, 32, 32), (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 0.50,
        how_to_get="extract cifar-100-python.tar.gz so that data-dir/cifar100/cifar-100-python exists",
    ),
    "svhn": DatasetInfo(
        "ufldl-stanford/svhn", "image", "label", 10, (3, 32, 32), (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), 0.90,
        subset="cropped_digits",
        how_to_get="put train_32x32.mat and test_32x32.mat in data-dir/svhn",
    ),
    "ag_news": DatasetInfo(
        "fancyzhx/ag_news", "text", "label", 4, (), (), (), 0.85, kind="text",
        how_to_get="put train.csv and test.csv (class index 1-4, title, description) in data-dir/ag_news",
    ),
    "digits": DatasetInfo(
        "", "image", "label", 10, (1, 8, 8), (0.3031,), (0.3763,), 0.90,
        how_to_get="ships with scikit-learn (sklearn.datasets.load_digits)",
    ),
}


class DatasetUnavailable(RuntimeError):
    """The dataset is neither in local files nor reachable on the hub."""


@dataclass
class ArrayData:
    """A split as arrays: x uint8 (N, C, H, W) images (or object array of str), y int64 (N,)."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


# ---------------------------------------------------------------------------
# Local files -> DatasetDict with the hub's columns and row order
# ---------------------------------------------------------------------------


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _find(dirs: list[Path], names: list[str]) -> Path | None:
    for d in dirs:
        for n in names:
            for cand in (d / n, d / (n + ".gz")):
                if cand.exists():
                    return cand
    return None


def _local_dirs(name: str, data_dir: str) -> list[Path]:
    dirs = []
    if data_dir:
        dirs += [Path(data_dir) / name, Path(data_dir)]
    dirs += [Path(p) for p in DATASETS[name].local_dirs]
    return [d for d in dirs if d.is_dir()]


def _load_local_arrays(name: str, data_dir: str) -> tuple[ArrayData, ArrayData] | None:
    """Read the train and test splits from local files; None if not found."""
    dirs = _local_dirs(name, data_dir)
    if name in ("fashion_mnist", "mnist"):
        def idx_file(stem: str, dim: int) -> Path | None:  # both spellings in use: train-images-idx3-ubyte / .idx3-
            return _find(dirs, [f"{stem}-idx{dim}-ubyte", f"{stem}.idx{dim}-ubyte"])

        files = {"trx": idx_file("train-images", 3), "try": idx_file("train-labels", 1),
                 "tex": idx_file("t10k-images", 3), "tey": idx_file("t10k-labels", 1)}
        if any(v is None for v in files.values()):
            return None
        tr = ArrayData(_read_idx(files["trx"])[:, None], _read_idx(files["try"]).astype(np.int64))
        te = ArrayData(_read_idx(files["tex"])[:, None], _read_idx(files["tey"]).astype(np.int64))
        return tr, te
    if name in ("cifar10", "cifar100"):
        sub = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
        for d in dirs:
            root = d / sub
            if not root.is_dir():
                continue
            if name == "cifar10":
                train_files = [root / f"data_batch_{i}" for i in range(1, 6)]
                test_files, key = [root / "test_batch"], b"labels"
            else:
                train_files, test_files, key = [root / "train"], [root / "test"], b"fine_labels"

            def read(files: list[Path]) -> ArrayData:
                xs, ys = [], []
                for f in files:
                    with open(f, "rb") as fh:
                        b = pickle.load(fh, encoding="bytes")
                    xs.append(np.asarray(b[b"data"], np.uint8).reshape(-1, 3, 32, 32))
                    ys.append(np.asarray(b[key], np.int64))
                return ArrayData(np.concatenate(xs), np.concatenate(ys))

            return read(train_files), read(test_files)
        return None
    if name == "svhn":
        tr, te = _find(dirs, ["train_32x32.mat"]), _find(dirs, ["test_32x32.mat"])
        if tr is None or te is None:
            return None
        from scipy.io import loadmat

        def read_mat(p: Path) -> ArrayData:
            m = loadmat(p)
            y = m["y"].reshape(-1).astype(np.int64)
            y[y == 10] = 0  # the hub's convention: digit 0 has label 0
            return ArrayData(np.transpose(m["X"], (3, 2, 0, 1)).astype(np.uint8), y)

        return read_mat(tr), read_mat(te)
    if name == "ag_news":
        tr, te = _find(dirs, ["train.csv"]), _find(dirs, ["test.csv"])
        if tr is None or te is None:
            return None
        import csv

        def read_csv(p: Path) -> ArrayData:
            texts, labels = [], []
            with open(p, newline="", encoding="utf-8") as fh:
                for row in csv.reader(fh):
                    if not row or not row[0].strip().isdigit():
                        continue  # header
                    labels.append(int(row[0]) - 1)
                    texts.append(" ".join(s.strip() for s in row[1:]))
            return ArrayData(np.asarray(texts, dtype=object), np.asarray(labels, np.int64))

        return read_csv(tr), read_csv(te)
    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        d = load_digits()
        x = np.clip(d.images * 16, 0, 255).astype(np.uint8)[:, None]  # 0..16 -> 0..255
        xtr, xte, ytr, yte = train_test_split(x, d.target.astype(np.int64), test_size=0.2, random_state=0, stratify=d.target)
        return ArrayData(xtr, ytr), ArrayData(xte, yte)
    raise KeyError(name)


def _to_hf(name: str, split: ArrayData):
    """Wrap arrays as a datasets.Dataset with the hub's column names."""
    from datasets import Array2D, Array3D, ClassLabel, Dataset, Features, Value

    info = DATASETS[name]
    label = ClassLabel(num_classes=info.num_classes)
    if info.kind == "text":
        feats = Features({info.image_col: Value("string"), info.label_col: label})
        return Dataset.from_dict({info.image_col: list(split.x), info.label_col: split.y}, features=feats)
    c, h, w = info.shape
    if c == 1:
        feats = Features({info.image_col: Array2D((h, w), "uint8"), info.label_col: label})
        x = split.x[:, 0]
    else:  # stored HWC like decoded hub images
        feats = Features({info.image_col: Array3D((h, w, c), "uint8"), info.label_col: label})
        x = np.transpose(split.x, (0, 2, 3, 1))
    return Dataset.from_dict({info.image_col: x, info.label_col: split.y}, features=feats)


def _from_hf(name: str, ds) -> ArrayData:
    """Convert a (hub or local) datasets.Dataset split to ArrayData (NCHW uint8)."""
    info = DATASETS[name]
    if len(ds) == 0:  # e.g. Dirichlet(0.01) leaves some partitions empty
        return ArrayData(np.zeros((0, *info.shape), np.uint8) if info.kind != "text" else np.zeros(0, object),
                         np.zeros(0, np.int64))
    cols = ds.with_format("numpy")[:]
    y = np.asarray(cols[info.label_col], np.int64)
    if info.kind == "text":
        return ArrayData(np.asarray(ds[info.image_col], dtype=object), y)
    x = cols[info.image_col]
    if x.dtype == object:  # ragged PIL decode
        x = np.stack([np.asarray(i) for i in x])
    x = np.asarray(x).astype(np.uint8)
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3):
        x = np.transpose(x, (0, 3, 1, 2))
    if x.shape[1:] != info.shape:
        raise ValueError(f"dataset '{name}': got images of shape {x.shape[1:]}, expected {info.shape}")
    return ArrayData(x, y)


# ---------------------------------------------------------------------------
# Partitioners (flwr-datasets) and sources
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DataSpec:
    """Everything that determines a partition."""

    dataset: str = "fashion_mnist"
    source: str = "auto"
    data_dir: str = ""
    partitioner: str = "dirichlet"
    num_partitions: int = 10
    alpha: float = 0.6
    min_partition_size: int = 10
    balance: bool = False
    max_draws: int = 11
    shards_per_client: int = 4
    seed: int = 42
    server_holdout: int = 0  # train samples kept out of every partition for the server (FedBE's unlabeled set)

    @classmethod
    def from_config(cls, cfg: dict[str, Any], num_partitions: int) -> DataSpec:
        return cls(
            dataset=cfg["dataset"], source=cfg["data-source"], data_dir=cfg["data-dir"],
            partitioner=cfg["partitioner"], num_partitions=int(num_partitions),
            alpha=cfg["dirichlet-alpha"], min_partition_size=cfg["dirichlet-min-size"],
            balance=cfg["dirichlet-balance"], max_draws=cfg["dirichlet-max-draws"],
            shards_per_client=cfg["shards-per-client"], seed=cfg["partition-seed"],
            server_holdout=cfg["server-holdout"],
        )

    def key(self) -> str:
        # hub and local give the same rows; a draw that succeeds is the same under any max_draws
        d = {k: v for k, v in self.__dict__.items() if k not in ("source", "max_draws")}
        if self.partitioner != "dirichlet":
            d.pop("alpha"), d.pop("min_partition_size"), d.pop("balance")
        if self.partitioner != "shards":
            d.pop("shards_per_client")
        if not self.server_holdout:  # keys of specs without a holdout are unchanged
            d.pop("server_holdout")
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _resampling_dirichlet():
    """Build the class lazily: flwr-datasets is imported only when a partition is made."""
    from flwr_datasets.partitioner import DirichletPartitioner

    class ResamplingDirichletPartitioner(DirichletPartitioner):
        """Dirichlet(alpha) by class that redraws until every partition holds ``min_partition_size``.

        flwr-datasets' :class:`DirichletPartitioner` gives up after 11 draws; the FENS authors
        redraw without limit (about 1,000 draws for Dir(0.01) on 20 clients): docs/readings.md#fens-partitions.
        Within the parent's 11 draws the partitions are the parent's, index for index.

        Parameters
        ----------
        max_draws : int
            Give up (``ValueError`` naming the key) after this many draws; 11 is flwr-datasets' limit.
        **kwargs
            Passed to :class:`DirichletPartitioner`.
        """

        def __init__(self, *, max_draws: int = 11, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.max_draws = max(int(max_draws), 1)
            self.draws = 0

        def _determine_partition_id_to_indices_if_needed(self) -> None:
            # The parent's algorithm and random stream (one Dirichlet per class, balancing,
            # redraw, final shuffle), but a draw is judged on counts, so 1,000 draws take seconds.
            if self._partition_id_to_indices_determined:
                return
            targets = _column(self.dataset, self._partition_by)
            self._unique_classes = sorted(self.dataset.unique(self._partition_by))
            members = [np.nonzero(targets == k)[0] for k in self._unique_classes]
            n = self._num_partitions
            self._avg_num_of_samples_per_partition = avg = self.dataset.num_rows / n
            for draw in range(1, self.max_draws + 1):
                counts = np.zeros(n, np.int64)
                cuts = []
                for idx in members:
                    prop = self._rng.dirichlet(self._alpha)
                    if self._self_balancing:
                        prop = np.where(counts > avg, 0.0, prop)
                        prop = prop / sum(prop.tolist())  # the parent's left-to-right sum, bit for bit
                    cut = (np.cumsum(prop) * len(idx)).astype(int)[:-1]
                    cuts.append(cut)
                    counts += np.diff(np.concatenate(([0], cut, [len(idx)])))
                if counts.min() >= self._min_partition_size:
                    break
            else:
                raise ValueError(
                    f"dirichlet-max-draws = {self.max_draws}: no Dirichlet({self._alpha[0]:g}) draw gave every one of "
                    f"{n} partitions >= {self._min_partition_size} samples (dirichlet-min-size); "
                    "raise dirichlet-max-draws or alpha, or lower dirichlet-min-size"
                )
            self.draws = draw
            parts: dict[int, list[int]] = {p: [] for p in range(n)}
            for idx, cut in zip(members, cuts):
                for p, chunk in enumerate(np.split(idx, cut)):
                    parts[p].extend(chunk.tolist())
            if self._shuffle:
                for indices in parts.values():
                    self._rng.shuffle(indices)
            self._partition_id_to_indices = parts
            self._partition_id_to_indices_determined = True

    return ResamplingDirichletPartitioner


def make_partitioner(spec: DataSpec, num_train: int):
    """The flwr-datasets partitioner for a spec (IID, Dirichlet(alpha), pathological shards)."""
    from flwr_datasets.partitioner import IidPartitioner, ShardPartitioner

    label = DATASETS[spec.dataset].label_col
    if spec.partitioner == "iid":
        return IidPartitioner(num_partitions=spec.num_partitions)
    if spec.partitioner == "dirichlet":
        return _resampling_dirichlet()(
            num_partitions=spec.num_partitions, partition_by=label, alpha=spec.alpha,
            min_partition_size=spec.min_partition_size, self_balancing=spec.balance, seed=spec.seed,
            max_draws=spec.max_draws,
        )
    if spec.partitioner == "shards":
        # McMahan et al.: num_partitions * shards_per_client equal shards of label-sorted data
        total = spec.num_partitions * spec.shards_per_client
        return ShardPartitioner(
            num_partitions=spec.num_partitions, partition_by=label,
            num_shards_per_partition=spec.shards_per_client, shard_size=num_train // total,
            seed=spec.seed,
        )
    raise ValueError(f"unknown partitioner {spec.partitioner!r}")


_LOCAL_MARKERS = {
    "fashion_mnist": ["train-images-idx3-ubyte", "train-images.idx3-ubyte"],
    "mnist": ["train-images-idx3-ubyte", "train-images.idx3-ubyte"],
    "cifar10": ["cifar-10-batches-py/data_batch_1"],
    "cifar100": ["cifar-100-python/train"],
    "svhn": ["train_32x32.mat"],
    "ag_news": ["train.csv"],
}


def local_available(name: str, data_dir: str = "") -> bool:
    """Whether local files for the dataset exist (digits always: it ships with scikit-learn)."""
    if name == "digits":
        return True
    if data_dir and (Path(data_dir) / name / "dataset_dict.json").exists():
        return True
    return _find(_local_dirs(name, data_dir), _LOCAL_MARKERS[name]) is not None


def _resolve_source(spec: DataSpec) -> str:
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
        return _from_hf(name, dd["train"]), _from_hf(name, dd["test"])
    arrays = _load_local_arrays(name, data_dir)
    if arrays is None:
        raise DatasetUnavailable(
            f"dataset '{name}' not found in local files (searched {[str(d) for d in _local_dirs(name, data_dir)] or 'no existing directory'}). "
            f"To get it: {DATASETS[name].how_to_get}; or use data-source = 'hub' with internet access."
        )
    return arrays


def local_datasetdict(name: str, data_dir: str = ""):
    """The local splits as a DatasetDict with the hub's columns and row order (not yet shuffled)."""
    from datasets import DatasetDict

    train, test = local_arrays(name, data_dir)
    return DatasetDict({"train": _to_hf(name, train), "test": _to_hf(name, test)})


ROW = "hetfl_row"  # the column of a row index dataset: the row's position in the local arrays


def _row_index(name: str, split: ArrayData):
    """A split as a datasets.Dataset of its labels and row positions, without the images.

    Shuffling (a permutation drawn from the seed and the length alone), the Divider and the
    partitioners read nothing but the label column, so they pick the same rows as on the full
    dataset; :func:`_to_arrays` then takes those rows from the arrays. Skipping the image column
    saves the Arrow round trip of every image (seconds per ClientApp process).
    """
    from datasets import ClassLabel, Dataset, Features, Value

    info = DATASETS[name]
    feats = Features({info.label_col: ClassLabel(num_classes=info.num_classes), ROW: Value("int64")})
    return Dataset.from_dict({info.label_col: split.y, ROW: np.arange(len(split.y), dtype=np.int64)}, features=feats)


def _column(ds, name: str) -> np.ndarray:
    """One column of a datasets.Dataset as a NumPy array, read in one batch (not row by row)."""
    return np.asarray(ds.with_format("numpy", columns=[name])[:][name])


def _take(split: ArrayData, index) -> ArrayData:
    """The rows of `split` that a row index dataset (or a part of one) names, in its order."""
    rows = _column(index, ROW).astype(np.int64)  # an empty partition's column comes back as float64
    return ArrayData(split.x[rows], split.y[rows])


def _to_arrays(spec: DataSpec, ds) -> ArrayData:
    """A partition or split (hub rows, or a row index of the local train split) as arrays."""
    if ROW not in ds.column_names:
        return _from_hf(spec.dataset, ds)
    return _take(local_arrays(spec.dataset, spec.data_dir)[0], ds)


@lru_cache(maxsize=4)
def _partitioner_for(spec: DataSpec):
    """A partitioner with its dataset assigned (local) or a FederatedDataset (hub)."""
    if _resolve_source(spec) == "hub":
        info = DATASETS[spec.dataset]
        if not info.hub_id:
            raise DatasetUnavailable(f"dataset '{spec.dataset}' has no hub version; {info.how_to_get}")
        from flwr_datasets import FederatedDataset

        # shard size needs the train length: FederatedDataset loads lazily, so build a probe first
        probe = FederatedDataset(dataset=info.hub_id, subset=info.subset, partitioners={"train": 1}, shuffle=True, seed=spec.seed)
        try:
            n_train = len(probe.load_split("train"))
        except Exception as err:  # noqa: BLE001 - network/hub errors come in many types
            raise DatasetUnavailable(
                f"dataset '{spec.dataset}' could not be loaded from the Hugging Face hub ({info.hub_id}): {err}. "
                f"Offline: {info.how_to_get}, and set data-source = 'local'."
            ) from err
        if not spec.server_holdout:
            return FederatedDataset(
                dataset=info.hub_id, subset=info.subset,
                partitioners={"train": make_partitioner(spec, n_train)}, shuffle=True, seed=spec.seed,
            )
        return FederatedDataset(  # the first server_holdout shuffled rows go to the server, the rest to clients
            dataset=info.hub_id, subset=info.subset, preprocessor=_holdout_divider(spec, n_train),
            partitioners={"clients": make_partitioner(spec, n_train - spec.server_holdout)}, shuffle=True, seed=spec.seed,
        )
    # exactly what FederatedDataset does with the hub's DatasetDict: shuffle every split with the seed
    train = _local_train_splits(spec)[0]
    part = make_partitioner(spec, len(train))
    part.dataset = train
    return part


def _holdout_divider(spec: DataSpec, n_train: int):
    """flwr-datasets Divider: the shuffled train split's first `server_holdout` rows -> 'server', the rest -> 'clients'."""
    from flwr_datasets.preprocessor import Divider

    if not 0 < spec.server_holdout < n_train:
        raise ValueError(f"server-holdout = {spec.server_holdout}: expected 0 < n < {n_train} (the train split's size)")
    return Divider(divide_config={"server": spec.server_holdout, "clients": n_train - spec.server_holdout},
                   divide_split="train", drop_remaining_splits=True)


def _local_train_splits(spec: DataSpec):
    """(clients' train split, server's held-out split or None) from local files, as FederatedDataset makes them."""
    from datasets import DatasetDict

    train = _row_index(spec.dataset, local_arrays(spec.dataset, spec.data_dir)[0]).shuffle(seed=spec.seed)
    if not spec.server_holdout:
        return train, None
    dd = _holdout_divider(spec, len(train))(DatasetDict({"train": train}))
    return dd["clients"], dd["server"]


def load_server_set(spec: DataSpec, cache_dir: str = "") -> ArrayData:
    """The `server_holdout` train samples no client holds (FedBE's unlabeled server set; the server must not
    use its labels)."""
    if not spec.server_holdout:
        raise ValueError("load_server_set: the spec holds nothing out (server-holdout = 0)")
    tag = hashlib.sha1(f"{spec.seed}-{spec.server_holdout}-{spec.data_dir}".encode()).hexdigest()[:12]
    path = _cache_root(cache_dir) / spec.dataset / f"server-{tag}.npz"  # the same for any partitioning
    if str(path) in _MEM:
        return _MEM[str(path)]
    if path.exists():
        data = _load_npz(path)
    else:
        if _resolve_source(spec) == "hub":
            ds = _partitioner_for(spec).load_split("server")
        else:
            ds = _local_train_splits(spec)[1]
        data = _to_arrays(spec, ds)
        _atomic_save(path, data)
    _MEM[str(path)] = data
    return data


def _cache_root(cache_dir: str) -> Path:
    root = Path(cache_dir or os.environ.get("HETFL_CACHE", Path.home() / ".cache" / "hetfl"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _atomic_save(path: Path, data: ArrayData) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    os.close(fd)
    np.savez(tmp, x=data.x, y=data.y)
    os.replace(tmp, path)


def _load_npz(path: Path) -> ArrayData:
    with np.load(path, allow_pickle=True) as z:
        return ArrayData(z["x"], z["y"])


_MEM: dict[str, ArrayData] = {}


def load_partition(spec: DataSpec, partition_id: int, cache_dir: str = "") -> ArrayData:
    """Partition `partition_id` of the train split as arrays (deterministic given the spec)."""
    if not 0 <= partition_id < spec.num_partitions:
        raise ValueError(f"partition-id {partition_id} out of range [0, {spec.num_partitions})")
    path = _cache_root(cache_dir) / spec.dataset / spec.key() / f"part-{partition_id:05d}.npz"
    mem_key = str(path)
    if mem_key in _MEM:
        return _MEM[mem_key]
    if path.exists():
        data = _load_npz(path)
    else:
        part = _partitioner_for(spec)
        try:
            data = _to_arrays(spec, part.load_partition(partition_id))
        except IndexError:
            if spec.partitioner != "iid" or partition_id == 0:
                raise
            # more clients than rows: IidPartitioner's contiguous shard of this id is empty, and `datasets` refuses
            # to select an empty range at the end; the client holds no data (it trains nothing and weighs 0)
            first = load_partition(spec, 0, cache_dir)
            data = ArrayData(first.x[:0], first.y[:0])
        _atomic_save(path, data)
    _MEM[mem_key] = data
    return data


def load_test(name: str, source: str = "auto", data_dir: str = "", cache_dir: str = "", seed: int = 42) -> ArrayData:
    """The centralized test split (in the hub's row order after the shared shuffle)."""
    tag = hashlib.sha1(data_dir.encode()).hexdigest()[:8]
    path = _cache_root(cache_dir) / name / f"test-{seed}-{tag}.npz"
    if str(path) in _MEM:
        return _MEM[str(path)]
    if path.exists():
        data = _load_npz(path)
    else:
        spec = DataSpec(dataset=name, source=source, data_dir=data_dir, partitioner="iid", num_partitions=1, seed=seed)
        if _resolve_source(spec) == "hub":
            data = _from_hf(name, _partitioner_for(spec).load_split("test"))
        else:
            test = local_arrays(name, data_dir)[1]
            data = _take(test, _row_index(name, test).shuffle(seed=seed))
        _atomic_save(path, data)
    _MEM[str(path)] = data
    return data


def label_histogram(y: np.ndarray, num_classes: int) -> np.ndarray:
    """Per-class sample counts."""
    return np.bincount(y, minlength=num_classes)
