"""Datasets by name, from the Hugging Face hub or local files, partitioned by flwr-datasets.

Two sources give the same partitions:

* ``hub``: :class:`flwr_datasets.FederatedDataset` downloads the dataset, shuffles it
  with ``partition-seed`` and hands the train split to the partitioner.
* ``local``: the same splits are read from local files (IDX, CIFAR pickles, SVHN .mat,
  AG News CSV, a ``save_to_disk`` directory, or scikit-learn's digits) as arrays in the
  hub's row order. A :class:`datasets.Dataset` of the hub's label column and the row
  positions is shuffled with the same seed and given to the same flwr-datasets partitioner;
  the rows it picks are taken from the arrays (see :func:`_row_index`).

Besides the named datasets of :data:`DATASETS`, a run may bring its own (docs/bring-your-own.md):
``dataset = "hub:<id>[:<subset>]"`` or ``dataset = "dir:<directory>"``, with the columns named by
``input-column`` / ``label-column``. Such a *reference* is read with the `datasets` readers
(:func:`read_directory`, :func:`read_reference`), described from its features and first row
(:func:`describe`), converted to arrays in its own row order and then partitioned exactly like the
local files of a named dataset.

A SuperNode started with ``--node-config 'data-path="<dir>"'`` trains on that directory alone
(docs/node-data.md): :func:`load_local_data` reads it with the same readers and checks that it fits the
run's :class:`DatasetInfo`, raising one :class:`LocalDataError` otherwise. The server's evaluation set may
come from a directory the same way (run-config ``server-data-path``).

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
from collections.abc import Callable, Sequence
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
    class_names: tuple[str, ...] = ()  # the name of each class id (a ClassLabel's names); () = plain integer ids


DATASETS: dict[str, DatasetInfo] = {
    "fashion_mnist": DatasetInfo(
        "zalando-datasets/fashion_mnist", "image", "label", 10, (1, 28, 28), (0.2860,), (0.3530,), 0.80,
        local_dirs=("/usr/share/datasets/fashion-mnist",),
        how_to_get="apt-get install dataset-fashion-mnist (IDX files in /usr/share/datasets/fashion-mnist), "
        "or put train/t10k-*-idx*-ubyte[.gz] in data-dir/fashion_mnist",
        class_names=("T - shirt / top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                     "Ankle boot"),
    ),
    "mnist": DatasetInfo(
        "ylecun/mnist", "image", "label", 10, (1, 28, 28), (0.1307,), (0.3081,), 0.90,
        local_dirs=("/usr/share/datasets/mnist",),
        how_to_get="put the MNIST IDX files (train/t10k-*-idx*-ubyte[.gz]) in data-dir/mnist",
        class_names=tuple(str(i) for i in range(10)),
    ),
    "cifar10": DatasetInfo(
        "uoft-cs/cifar10", "img", "label", 10, (3, 32, 32), (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 0.70,
        how_to_get="extract cifar-10-python.tar.gz so that data-dir/cifar10/cifar-10-batches-py exists",
        class_names=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
    ),
    "cifar100": DatasetInfo(
        "uoft-cs/cifar100", "img", "fine_label", 100, (3, 32, 32), (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 0.50,
        how_to_get="extract cifar-100-python.tar.gz so that data-dir/cifar100/cifar-100-python exists",
    ),
    "svhn": DatasetInfo(
        "ufldl-stanford/svhn", "image", "label", 10, (3, 32, 32), (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), 0.90,
        subset="cropped_digits",
        how_to_get="put train_32x32.mat and test_32x32.mat in data-dir/svhn",
        class_names=tuple(str(i) for i in range(10)),
    ),
    "ag_news": DatasetInfo(
        "fancyzhx/ag_news", "text", "label", 4, (), (), (), 0.85, kind="text",
        how_to_get="put train.csv and test.csv (class index 1-4, title, description) in data-dir/ag_news",
        class_names=("World", "Sports", "Business", "Sci/Tech"),
    ),
    "digits": DatasetInfo(
        "", "image", "label", 10, (1, 8, 8), (0.3031,), (0.3763,), 0.90,
        how_to_get="ships with scikit-learn (sklearn.datasets.load_digits)",
        class_names=tuple(str(i) for i in range(10)),
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


class LocalDataError(ValueError):
    """Data on this machine does not fit the run: one line naming where the data is, what was found and what the
    run expects.

    Raised for a node's ``data-path`` (the ClientApp's handler fails with it; Flower returns it to the server as
    the reply's error, see :func:`is_local_data_error`), for ``server-data-path`` and for a ``dir:``/``hub:``
    dataset reference. docs/node-data.md
    """


def is_local_data_error(reason: str) -> bool:
    """Whether the error reason of a failed reply (``Message.error.reason``) is a :class:`LocalDataError`.

    The Deployment Engine reports ``<class '...LocalDataError'>:<'node data-path ...'>``; the Simulation Engine
    wraps the message in a ClientAppException, so the message's own start (``node data-path '``) is matched too.
    """
    return "LocalDataError" in reason or "node data-path '" in reason


# ---------------------------------------------------------------------------
# Bring your own dataset: references, readers, description, conversion
# ---------------------------------------------------------------------------

BYO_PREFIXES = ("hub:", "dir:")
"""Run-config ``dataset`` values that are not a name of :data:`DATASETS` (docs/bring-your-own.md)."""

INPUT_COLUMNS = ("image", "img", "text")  # input-column = '': the first of these the dataset has

BYO_NORM = 0.5  # mean and std of every channel of a bring-your-own image dataset ([0, 255] -> [-1, 1])
BYO_THRESHOLD = 0.8  # convergence threshold of a bring-your-own dataset when convergence-threshold = 0


def is_byo(name: str) -> bool:
    """Whether a run-config ``dataset`` value is a reference (``hub:...`` / ``dir:...``) rather than a named dataset."""
    return name.startswith(BYO_PREFIXES)


def parse_reference(name: str) -> tuple[str, str, str | None]:
    """``"hub:<id>[:<subset>]"`` -> ``("hub", id, subset)``; ``"dir:<path>"`` -> ``("dir", path, None)``."""
    kind, _, rest = name.partition(":")
    if kind == "hub":
        hub_id, _, subset = rest.partition(":")
        return "hub", hub_id, subset or None
    if kind == "dir":
        return "dir", rest, None
    raise ValueError(f"dataset {name!r} is not a reference; expected 'hub:<id>[:<subset>]' or 'dir:<path>'")


def _dataset_files(path: Path) -> list[Path]:
    """The regular files of a directory tree that make up its data, sorted (hidden files and ``state.json``
    (whose `_fingerprint` save_to_disk draws at random) left out)."""
    return sorted(f for f in path.rglob("*") if f.is_file() and f.name != "state.json"
                  and not any(part.startswith(".") for part in f.relative_to(path).parts))


def _stat_signature(path: Path) -> str:
    """Cheap identity of a directory's current content: (relative path, size, mtime) of every data file."""
    h = hashlib.sha1(str(path.resolve()).encode())
    for f in _dataset_files(path):
        st = f.stat()
        h.update(f"{f.relative_to(path).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=32)
def _content_digest(path: str, signature: str) -> str:
    stored = _cache_root("") / "digests" / f"{signature}.txt"  # a deployed ClientApp process may live one message
    if stored.is_file():
        return stored.read_text().strip()
    h = hashlib.sha256()
    root = Path(path)
    for f in _dataset_files(root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    stored.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=stored.parent, suffix=".txt")
    with os.fdopen(fd, "w") as out:
        out.write(h.hexdigest())
    os.replace(tmp, stored)
    return h.hexdigest()


def content_digest(path: str | Path) -> str:
    """SHA-256 of a data directory's content: every data file's relative path and bytes, in path order.

    Hidden files and ``state.json`` are left out, so a copy of the directory, or the same rows saved again, has
    the same digest. Remembered (in the process, and under the cache root's ``digests/``) while no file's path,
    size or mtime changes.
    """
    p = Path(path)
    return _content_digest(str(p.resolve()), _stat_signature(p))


def content_client_id(path: str | Path) -> int:
    """The client id of a node whose node config names a ``data-path`` but neither ``client-id`` nor ``partition-id``:
    the first 31 bits of :func:`content_digest` (an integer in [0, 2**31)). docs/node-data.md"""
    return int(content_digest(path)[:8], 16) & 0x7FFFFFFF


def read_directory(path: str | Path, where: str):
    """A dataset directory as a :class:`datasets.DatasetDict`, read by the `datasets` library.

    * a directory written by ``Dataset.save_to_disk`` (what ``flwr-datasets create`` and ``python -m hetfl.export``
      write) or ``DatasetDict.save_to_disk`` (one subdirectory per split): :func:`datasets.load_from_disk`; a
      single Dataset comes back as the split ``train``;
    * anything else: :func:`datasets.load_dataset` on the directory, which picks its packaged reader from the
      files: ``imagefolder`` (class subfolders of images, a ``label`` ClassLabel named after the folders; a
      ``train/`` and ``test/`` level gives the splits), Parquet, CSV, JSON Lines, Arrow (split names from the
      file names, e.g. ``train-00000-of-00001.parquet``: the layout of a hub dataset's download).

    Raises
    ------
    LocalDataError
        The directory does not exist or holds nothing the readers understand; the message starts with `where`.
    """
    import datasets

    p = Path(path)
    if not p.is_dir():
        raise LocalDataError(f"{where}: no such directory; expected a directory written by Dataset.save_to_disk "
                             "or an image folder (one subfolder of images per class)")
    try:
        if (p / "dataset_dict.json").is_file():
            return datasets.load_from_disk(str(p))
        if (p / "state.json").is_file() and (p / "dataset_info.json").is_file():
            if not json.loads((p / "state.json").read_text()).get("_data_files", True):
                raise LocalDataError(f"{where}: holds no rows (a Dataset saved without data files); expected at least "
                                     "one labelled example")
            return datasets.DatasetDict({"train": datasets.load_from_disk(str(p))})
        out = datasets.load_dataset(str(p))
    except LocalDataError:
        raise
    except Exception as err:  # noqa: BLE001 - the readers raise many types for unreadable content
        raise unreadable(where, err) from err
    return out if isinstance(out, datasets.DatasetDict) else datasets.DatasetDict({"train": out})


def unreadable(where: str, err: Exception) -> LocalDataError:
    """The one line for data a reader could not read (a file that is no dataset, cut short, or not an image)."""
    first = str(err).splitlines()[0] if str(err) else ""
    return LocalDataError(f"{where}: could not be read as a dataset ({type(err).__name__}: {first}); expected a "
                          "directory written by Dataset.save_to_disk, an image folder (one subfolder of images per "
                          "class) or Parquet/CSV/JSON files")


def one_label_column(ds, info: DatasetInfo, where: str) -> None:
    """A node's data holds one label column: a second one (a ClassLabel, or a column named like a label) beside the
    run's would be read silently in its place elsewhere; LocalDataError naming both."""
    from datasets import ClassLabel

    extra = [c for c in ds.column_names if c not in (info.image_col, info.label_col)
             and (isinstance(ds.features[c], ClassLabel) or "label" in c.lower())]
    if extra:
        raise LocalDataError(f"{where}: has the columns {list(ds.column_names)}: a second label column {extra[0]!r} "
                             f"beside {info.label_col!r}, which the run reads (run-config label-column); expected one "
                             "label column (remove the other)")


def choose_split(dd, want: str, where: str):
    """Split `want` of a DatasetDict, or its only split; LocalDataError naming the splits found otherwise."""
    if want in dd:
        return dd[want]
    if len(dd) == 1:
        return next(iter(dd.values()))
    raise LocalDataError(f"{where}: holds the splits {sorted(dd)}; expected a split named {want!r} (or a single split)")


def read_reference(name: str):
    """The DatasetDict of a reference ``hub:<id>[:<subset>]`` (:func:`datasets.load_dataset`; its cache serves offline
    runs) or ``dir:<path>`` (:func:`read_directory`)."""
    kind, ref, subset = parse_reference(name)
    where = f"run-config key 'dataset' = {name!r}"
    if kind == "dir":
        return read_directory(ref, where)
    import datasets

    try:
        return datasets.load_dataset(ref, subset)
    except Exception as err:  # noqa: BLE001 - network/hub errors come in many types
        raise DatasetUnavailable(f"{where}: could not be loaded from the Hugging Face hub or its cache "
                                 f"({type(err).__name__}: {err})") from err


def _image_shape(x: np.ndarray) -> tuple[int, ...]:
    """(C, H, W) of one decoded image: (H, W) -> 1 channel, (H, W, C) with C <= 4 -> C channels, else as is."""
    if x.ndim == 2:
        return (1, *x.shape)
    if x.ndim == 3 and x.shape[-1] <= 4 and x.shape[0] > 4:
        return (x.shape[-1], x.shape[0], x.shape[1])
    return tuple(x.shape)


def _label_classes(feature) -> int | None:
    """The class count of a ClassLabel feature; None for an integer column; ValueError for anything else."""
    from datasets import ClassLabel, Value

    if isinstance(feature, ClassLabel):
        return feature.num_classes
    if isinstance(feature, Value) and feature.dtype.startswith(("int", "uint")):
        return None
    raise ValueError(str(feature))


def _class_key(name: str) -> str:
    """How class names are compared: case, spaces and punctuation ignored ('T-shirt/top' = 'T - shirt / top')."""
    return "".join(ch for ch in str(name).casefold() if ch.isalnum())


def is_integer_names(names: Sequence[str]) -> bool:
    """Whether `names` are a ClassLabel's default names ``'0', '1', ...`` (``ClassLabel(num_classes=n)``): ids, not names."""
    return list(names) == [str(i) for i in range(len(names))]


def class_ids(found: Sequence[str], run: Sequence[str], num_classes: int, where: str) -> np.ndarray:
    """The run's class id of each of a dataset's own class names (``found[i]`` -> ``out[i]``), matched by name.

    A node's image folder names its classes after its own sorted folders, so its label 0 is whatever class it holds
    first; the run's labels are the server's. Names are compared without case, spaces or punctuation. Default
    ClassLabel names (``'0'``, ``'1'``, ...) are class ids and keep their meaning, as do the names of a run whose
    classes have no names (plain integer labels). docs/node-data.md#labels

    Raises
    ------
    LocalDataError
        A class the run does not know (one line naming `where`, the classes and the run's classes), or an id outside
        [0, num_classes).
    """
    if is_integer_names(found):  # ClassLabel(num_classes=n): ids, never matched as names (a run's '10' sorts before '2')
        return np.arange(len(found), dtype=np.int64)
    run_keys = {_class_key(n): i for i, n in enumerate(run)}
    out, unknown = [], []
    for name in found:
        if _class_key(name) in run_keys:
            out.append(run_keys[_class_key(name)])
        elif str(name).isdigit() and not run and int(name) < num_classes:
            out.append(int(name))
        else:
            unknown.append(str(name))
    if unknown:
        known = f"the run's classes are {list(run)}" if run else (
            f"the run's classes have no names: integer ids 0..{num_classes - 1}")
        raise LocalDataError(f"{where}: holds {len(unknown)} class(es) the run does not know ({', '.join(map(repr, unknown))}); "
                             f"{known}; name every class folder (or ClassLabel name) like the server's data")
    if len(set(out)) < len(out):
        dup = sorted({run[i] if run else str(i) for i in out if out.count(i) > 1})
        raise LocalDataError(f"{where}: several of its classes {list(found)} match the run's class(es) {dup}; expected "
                             "one folder (or ClassLabel name) per class")
    return np.asarray(out, dtype=np.int64)


def _input_column(columns: list[str], input_col: str) -> str | None:
    return input_col if input_col else next((c for c in INPUT_COLUMNS if c in columns), None)


def describe(ds, name: str, input_col: str = "", label_col: str = "", num_classes: int = 0, where: str = "",
             run: DatasetInfo | None = None) -> DatasetInfo:
    """The :class:`DatasetInfo` of a bring-your-own dataset from its (train) split `ds`.

    Text if the input column holds strings, else images whose shape (C, H, W) is the first row's; the class count
    is `num_classes` if > 0, else the label column's ClassLabel. Images are normalised with mean = std =
    :data:`BYO_NORM` per channel (the same on every machine, whatever data it holds). docs/bring-your-own.md

    Parameters
    ----------
    input_col, label_col : str
        Column names ('' = the first of :data:`INPUT_COLUMNS` present / ``label``).
    where : str
        What the data is, for the error message (default: the run-config key ``dataset``).
    run : DatasetInfo, optional
        The run's description as the server sent it (a node describing its own ``data-path``): the result keeps this
        data's columns and takes the run's classes (names and count), shape and normalisation; a different kind of
        input or image shape is a LocalDataError naming both. The node's class names are matched to the run's when
        its data is read (:func:`class_ids`).
    """
    from datasets import ClassLabel

    where = where or f"run-config key 'dataset' = {name!r}"
    cols = list(ds.column_names)
    icol, lcol = _input_column(cols, input_col), label_col or "label"
    if icol is None or icol not in cols:
        wanted = f"{icol!r} (input-column)" if icol else f"one of {INPUT_COLUMNS} (or name it with input-column)"
        raise LocalDataError(f"{where}: has the columns {cols}; expected an input column {wanted}")
    if lcol not in cols:
        raise LocalDataError(f"{where}: has the columns {cols}; expected a label column {lcol!r} (label-column)")
    if len(ds) == 0:
        raise LocalDataError(f"{where}: holds no rows; expected at least one labelled example")
    try:
        found = _label_classes(ds.features[lcol])
    except ValueError:
        raise LocalDataError(f"{where}: label column {lcol!r} is {ds.features[lcol]}; expected integer class ids "
                             "(a ClassLabel or int column)") from None
    names = tuple(ds.features[lcol].names) if isinstance(ds.features[lcol], ClassLabel) else ()
    if run is not None:
        return _fit_to_run(ds, icol, lcol, run, where)
    if num_classes and found and num_classes < found:
        raise LocalDataError(f"{where}: label column {lcol!r} is a ClassLabel of {found} classes; run-config key "
                             f"'num-classes' = {num_classes} is fewer; expected 0 (= {found}) or at least {found}")
    names = () if is_integer_names(names) else names
    n = num_classes or found
    if not n:
        raise LocalDataError(f"{where}: label column {lcol!r} holds plain integers, so the number of classes is not "
                             "known; set run-config key 'num-classes' (or save the labels as a ClassLabel)")
    kind, shape = _input_kind(ds, icol, where)
    if kind == "text":
        return DatasetInfo("", icol, lcol, int(n), (), (), (), BYO_THRESHOLD, kind="text", class_names=names)
    return DatasetInfo("", icol, lcol, int(n), shape, (BYO_NORM,) * shape[0], (BYO_NORM,) * shape[0], BYO_THRESHOLD,
                       class_names=names)


def _input_kind(ds, icol: str, where: str) -> tuple[str, tuple[int, ...]]:
    """("text", ()) or ("image", (C, H, W) of the first row) of a split's input column; LocalDataError otherwise."""
    from datasets import Value

    feat = ds.features[icol]
    if isinstance(feat, Value) and feat.dtype in ("string", "large_string"):
        return "text", ()
    first = np.asarray(ds.with_format("numpy", columns=[icol])[0][icol])
    if first.dtype == object or first.ndim not in (2, 3):
        raise LocalDataError(f"{where}: input column {icol!r} holds {feat} values of shape {first.shape}; expected "
                             "images (H x W or H x W x C) or strings")
    shape = _image_shape(first)
    if shape[0] not in (1, 3):
        raise LocalDataError(f"{where}: images have {shape[0]} channels (shape {shape}); expected 1 (grayscale) or 3 (RGB)")
    return "image", shape


def _fit_to_run(ds, icol: str, lcol: str, run: DatasetInfo, where: str) -> DatasetInfo:
    """A node's own split described for the run: its columns, the run's classes, shape and normalisation.

    Raises
    ------
    LocalDataError
        Its inputs are of another kind (text / images) or another image shape than the run's (one line naming both).
    """
    from dataclasses import replace

    kind, shape = _input_kind(ds, icol, where)
    if kind != run.kind:
        raise LocalDataError(f"{where}: holds {kind} inputs (column {icol!r}); the run expects {run.kind} inputs")
    if kind == "image" and tuple(shape) != tuple(run.shape):
        raise LocalDataError(f"{where}: holds images of shape {tuple(shape)} (channels, height, width); the run expects "
                             f"{tuple(run.shape)}")
    return replace(run, image_col=icol, label_col=lcol)


def to_arrays(ds, info: DatasetInfo, where: str = "", allow_empty: bool = True) -> ArrayData:
    """A datasets.Dataset split -> :class:`ArrayData` (uint8 NCHW images or str texts, int64 labels) that fits `info`.

    Raises
    ------
    LocalDataError
        A column is missing, the split is empty (unless `allow_empty`), a label is not an integer in
        [0, num_classes), an image does not have the shape (C, H, W) of `info`, or a text is not a string. The
        message starts with `where`.
    """
    where = where or "dataset"
    cols = list(ds.column_names)
    for col, key in ((info.image_col, "input-column"), (info.label_col, "label-column")):
        if col not in cols:
            raise LocalDataError(f"{where}: has the columns {cols}; the run expects the columns "
                                 f"{[info.image_col, info.label_col]} (run-config {key} names the {col!r} one)")
    if len(ds) == 0:
        if not allow_empty:
            raise LocalDataError(f"{where}: holds no rows; the run expects at least one labelled example")
        return ArrayData(np.zeros((0, *info.shape), np.uint8) if info.kind != "text" else np.zeros(0, object),
                         np.zeros(0, np.int64))
    data = ds.with_format("numpy", columns=[info.image_col, info.label_col])[:]
    y = np.asarray(data[info.label_col])
    if y.dtype.kind not in "iu":
        raise LocalDataError(f"{where}: label column {info.label_col!r} holds {y.dtype} values (e.g. {y[0].item()!r}); "
                             f"the run expects integer class ids in [0, {info.num_classes})")
    if info.kind == "text":
        x = np.asarray(ds[info.image_col], dtype=object)
        if not all(isinstance(t, str) for t in x):
            raise LocalDataError(f"{where}: input column {info.image_col!r} does not hold strings; the run expects texts")
        return ArrayData(x, _run_labels(ds, y, info, where))
    x = data[info.image_col]
    if x.dtype == object:  # images of different sizes or modes come back one array each
        shapes = sorted({_image_shape(np.asarray(i)) for i in x})
        if len(shapes) > 1:
            raise LocalDataError(f"{where}: images of {len(shapes)} different shapes (e.g. {shapes[0]} and {shapes[-1]}, "
                                 f"as channels x height x width); the run expects {info.shape}")
        x = np.stack([np.asarray(i) for i in x])
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] <= 4 and x.shape[1] > 4:  # N H W C -> N C H W
        x = np.transpose(x, (0, 3, 1, 2))
    if tuple(x.shape[1:]) != tuple(info.shape):
        raise LocalDataError(f"{where}: images of shape {tuple(x.shape[1:])} (channels, height, width); the run "
                             f"expects {tuple(info.shape)}")
    if x.dtype != np.uint8:
        if x.dtype.kind not in "iuf" or x.min() < 0 or x.max() > 255 or (x.dtype.kind == "f" and not np.all(x == np.round(x))):
            raise LocalDataError(f"{where}: pixel values of type {x.dtype} in [{x.min()}, {x.max()}]; the run expects "
                                 "integers in [0, 255]")
        x = x.astype(np.uint8)
    return ArrayData(np.ascontiguousarray(x), _run_labels(ds, y, info, where))


def _run_labels(ds, y: np.ndarray, info: DatasetInfo, where: str) -> np.ndarray:
    """A split's labels as the run's class ids: a ClassLabel's ids matched by name (:func:`class_ids`), plain integers
    as they are; LocalDataError for a class the run does not know or an id outside [0, num_classes)."""
    feature = ds.features[info.label_col]
    # a ClassLabel: its ids become the run's, by name. A catalog dataset whose classes the catalog does not name
    # (CIFAR-100) keeps the ids of its own hub ClassLabel, as every copy of it has the same.
    if hasattr(feature, "names") and len(y) and y.min() >= 0 and (info.class_names or not info.hub_id):
        names = list(feature.names)
        if y.max() >= len(names):
            raise LocalDataError(f"{where}: label {int(y.max())} has no name in its ClassLabel of {len(names)} classes")
        used = np.unique(y)  # only the classes its rows use must be known to the run
        lookup = np.full(len(names), -1, np.int64)
        lookup[used] = class_ids([names[i] for i in used], info.class_names, info.num_classes, where) \
            if not is_integer_names(names) else used
        y = lookup[y]
    bad = (y < 0) | (y >= info.num_classes)
    if bad.any():
        raise LocalDataError(f"{where}: {int(bad.sum())} label(s) outside [0, {info.num_classes}) (e.g. {int(y[bad][0])} "
                             f"at row {int(np.nonzero(bad)[0][0])}, labels span {int(y.min())}..{int(y.max())}); the run "
                             f"expects {info.num_classes} classes")
    return y.astype(np.int64)


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


def _to_hf(dataset: str | DatasetInfo, split: ArrayData):
    """Wrap arrays as a datasets.Dataset with the dataset's column names (images as Array2D/Array3D HWC, labels as
    a ClassLabel): what :func:`to_arrays` turns back into the same arrays."""
    from datasets import Array2D, Array3D, ClassLabel, Dataset, Features, Value

    info = dataset_info(dataset) if isinstance(dataset, str) else dataset
    named = len(info.class_names) == info.num_classes
    label = ClassLabel(names=list(info.class_names)) if named else ClassLabel(num_classes=info.num_classes)
    if info.kind == "text":
        feats = Features({info.image_col: Value("string"), info.label_col: label})
        return Dataset.from_dict({info.image_col: [str(t) for t in split.x], info.label_col: split.y}, features=feats)
    c, h, w = info.shape
    if c == 1:
        feats = Features({info.image_col: Array2D((h, w), "uint8"), info.label_col: label})
        x = split.x[:, 0]
    else:  # stored HWC like decoded hub images
        feats = Features({info.image_col: Array3D((h, w, c), "uint8"), info.label_col: label})
        x = np.transpose(split.x, (0, 2, 3, 1))
    return Dataset.from_dict({info.image_col: x, info.label_col: split.y}, features=feats)


def _from_hf(dataset: str | DatasetInfo, ds) -> ArrayData:
    """Convert a (hub or local) datasets.Dataset split to ArrayData (NCHW uint8); see :func:`to_arrays`."""
    info = dataset_info(dataset) if isinstance(dataset, str) else dataset
    return to_arrays(ds, info, f"dataset {dataset if isinstance(dataset, str) else info.hub_id or 'split'!r}")


# ---------------------------------------------------------------------------
# What a run's dataset is: the named table, or the description of a reference
# ---------------------------------------------------------------------------

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
    return {"class-names": list(info.class_names), "num-classes": int(info.num_classes), "kind": info.kind,
            "shape": [int(v) for v in info.shape]}


def from_run_description(fields: dict[str, Any]) -> DatasetInfo:
    """The run's :class:`DatasetInfo` from :func:`run_description` (columns are filled in from the node's data)."""
    shape = tuple(int(v) for v in fields.get("shape", []))
    norm = (BYO_NORM,) * shape[0] if shape else ()
    return DatasetInfo("", "", "", int(fields["num-classes"]), shape, norm, norm, BYO_THRESHOLD,
                       kind=str(fields["kind"]), class_names=tuple(str(n) for n in fields.get("class-names", [])))


def info_by_name(name: str) -> DatasetInfo:
    """:class:`DatasetInfo` by the run-config ``dataset`` alone: the table, or the reference's latest description in
    this process (every app describes its run's dataset before it normalises a batch)."""
    if not is_byo(name):
        return DATASETS[name]
    if name not in _BY_NAME:
        raise LookupError(f"dataset {name!r} has not been described in this process; call dataset_info() with the "
                          "run config's input-column, label-column and num-classes first")
    return _BY_NAME[name]


def _cache_name(name: str) -> str:
    """Directory of a dataset under the cache root: its name, or ``byo-<hash>`` for a reference."""
    return f"byo-{hashlib.sha1(name.encode()).hexdigest()[:12]}" if is_byo(name) else name


def _reference_token(name: str) -> str:
    """What identifies a reference's content for the partition cache: the hub id, or the directory's file sizes and
    mtimes."""
    kind, ref, _ = parse_reference(name)
    return _stat_signature(Path(ref)) if kind == "dir" and Path(ref).is_dir() else name


# ---------------------------------------------------------------------------
# Partitioners (flwr-datasets) and sources
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DataSpec:
    """Everything that determines a partition (and where the server's data comes from)."""

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
    input_col: str = ""  # bring your own dataset: run-config input-column, label-column, num-classes
    label_col: str = ""
    num_classes: int = 0
    server_data_path: str = ""  # run-config server-data-path: the server's evaluation (and holdout) set

    @classmethod
    def from_config(cls, cfg: dict[str, Any], num_partitions: int) -> DataSpec:
        return cls(
            dataset=cfg["dataset"], source=cfg["data-source"], data_dir=cfg["data-dir"],
            partitioner=cfg["partitioner"], num_partitions=int(num_partitions),
            alpha=cfg["dirichlet-alpha"], min_partition_size=cfg["dirichlet-min-size"],
            balance=cfg["dirichlet-balance"], max_draws=cfg["dirichlet-max-draws"],
            shards_per_client=cfg["shards-per-client"], seed=cfg["partition-seed"],
            server_holdout=cfg["server-holdout"], input_col=cfg["input-column"], label_col=cfg["label-column"],
            num_classes=cfg["num-classes"], server_data_path=cfg["server-data-path"],
        )

    @property
    def info(self) -> DatasetInfo:
        """The dataset's description (:func:`dataset_info`)."""
        return dataset_info(self.dataset, self.input_col, self.label_col, self.num_classes)

    def key(self) -> str:
        # hub and local give the same rows; a draw that succeeds is the same under any max_draws
        d = {k: v for k, v in self.__dict__.items() if k not in ("source", "max_draws", "server_data_path")}
        if self.partitioner != "dirichlet":
            d.pop("alpha"), d.pop("min_partition_size"), d.pop("balance")
        if self.partitioner != "shards":
            d.pop("shards_per_client")
        if not self.server_holdout:  # keys of specs without a holdout are unchanged
            d.pop("server_holdout")
        for k in ("input_col", "label_col", "num_classes"):  # '' / 0 for named datasets: their keys are unchanged
            if not d[k]:
                d.pop(k)
        if is_byo(self.dataset):
            d["reference"] = _reference_token(self.dataset)
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

    label = spec.info.label_col
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
    """Whether local files for the dataset exist (digits always: it ships with scikit-learn; a ``dir:`` reference if
    its directory exists; a ``hub:`` reference never: it is read through the hub's cache)."""
    if is_byo(name):
        kind, ref, _ = parse_reference(name)
        return kind == "dir" and Path(ref).is_dir()
    if name == "digits":
        return True
    if data_dir and (Path(data_dir) / name / "dataset_dict.json").exists():
        return True
    return _find(_local_dirs(name, data_dir), _LOCAL_MARKERS[name]) is not None


HUB_PROBE_TIMEOUT_S = 5.0  # pre-flight: one look at the hub, never retried (hetfl.launch.preflight)
_TRUE = ("1", "on", "yes", "true")


def hub_endpoint() -> str:
    """The Hugging Face hub the datasets library talks to (``HF_ENDPOINT``, else huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_cached(hub_id: str) -> bool:
    """Whether the hub dataset is in this machine's Hugging Face caches (hub snapshots or the datasets cache), from
    which ``datasets`` loads it offline."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    hub = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or home / "hub")
    cache = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets")
    org, _, name = hub_id.partition("/")
    return (hub / f"datasets--{org}--{name}").is_dir() or (cache / f"{org}___{name}").is_dir()


def _probe_hub(url: str, timeout: float) -> str | None:
    """One GET of `url`, bounded by `timeout` in all (name resolution included); None if it answered 2xx/3xx."""
    import threading
    import urllib.error
    import urllib.request

    out: list[str | None] = []

    def get() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout):
                out.append(None)
        except urllib.error.HTTPError as err:
            out.append(f"the hub answered HTTP {err.code} for {url}")
        except (OSError, ValueError) as err:
            out.append(f"the hub did not answer ({url}: {getattr(err, 'reason', err)})")

    t = threading.Thread(target=get, name="hub-probe", daemon=True)
    t.start()
    t.join(timeout)
    return out[0] if out else f"the hub did not answer within {timeout:g} s ({url})"


def hub_unavailable(hub_id: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot serve dataset `hub_id` here (one phrase), or None when it can: in the local Hugging Face
    cache, or the hub answered one request within `timeout` s. With ``HF_HUB_OFFLINE`` set nothing is sent."""
    if not hub_id:
        return "it has no Hugging Face hub version"
    if hub_cached(hub_id):
        return None
    if any(os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return "it is not in the Hugging Face cache and HF_HUB_OFFLINE is set"
    return _probe_hub(f"{hub_endpoint()}/api/datasets/{hub_id}", timeout)


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
        return _from_hf(name, dd["train"]), _from_hf(name, dd["test"])
    arrays = _load_local_arrays(name, data_dir)
    if arrays is None:
        raise DatasetUnavailable(
            f"dataset '{name}' not found in local files (searched {[str(d) for d in _local_dirs(name, data_dir)] or 'no existing directory'}). "
            f"To get it: {DATASETS[name].how_to_get}; or use data-source = 'hub' with internet access."
        )
    return arrays


@lru_cache(maxsize=4)
def _reference_arrays(name: str, input_col: str, label_col: str, num_classes: int, token: str
                      ) -> tuple[ArrayData, ArrayData | None]:
    """(train, test or None) of a reference as arrays in its own row order; `token` (:func:`_reference_token`)
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
                                 _reference_token(spec.dataset))
    return local_arrays(spec.dataset, spec.data_dir)


def local_datasetdict(name: str, data_dir: str = ""):
    """The local splits as a DatasetDict with the hub's columns and row order (not yet shuffled)."""
    from datasets import DatasetDict

    train, test = local_arrays(name, data_dir)
    return DatasetDict({"train": _to_hf(name, train), "test": _to_hf(name, test)})


ROW = "hetfl_row"  # the column of a row index dataset: the row's position in the local arrays


def _row_index(info: DatasetInfo, split: ArrayData):
    """A split as a datasets.Dataset of its labels and row positions, without the images.

    Shuffling (a permutation drawn from the seed and the length alone), the Divider and the
    partitioners read nothing but the label column, so they pick the same rows as on the full
    dataset; :func:`_to_arrays` then takes those rows from the arrays. Skipping the image column
    saves the Arrow round trip of every image (seconds per ClientApp process).
    """
    from datasets import ClassLabel, Dataset, Features, Value

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
        return to_arrays(ds, spec.info, f"dataset {spec.dataset!r}")
    return _take(source_arrays(spec)[0], ds)


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

    train = _row_index(spec.info, source_arrays(spec)[0]).shuffle(seed=spec.seed)
    if not spec.server_holdout:
        return train, None
    dd = _holdout_divider(spec, len(train))(DatasetDict({"train": train}))
    return dd["clients"], dd["server"]


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
    extra = "" if not is_byo(spec.dataset) else _reference_token(spec.dataset) + repr(spec.info)
    tag = hashlib.sha1(f"{spec.seed}-{spec.server_holdout}-{spec.data_dir}{extra}".encode()).hexdigest()[:12]
    path = _cache_root(cache_dir) / _cache_name(spec.dataset) / f"server-{tag}.npz"  # the same for any partitioning

    def build() -> ArrayData:
        if _resolve_source(spec) == "hub":
            return _to_arrays(spec, _partitioner_for(spec).load_split("server"))
        return _to_arrays(spec, _local_train_splits(spec)[1])

    return cached(path, build)


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


def cached(path: Path, build: Callable[[], ArrayData]) -> ArrayData:
    """The arrays cached at `path`: from this process's memory, else from the .npz file, else ``build()`` saved there
    (atomically, so concurrent ClientApps never read a half-written file). The one cache of partitions, test and
    server sets and node-local directories; `path` names everything the arrays depend on."""
    key = str(path)
    if key not in _MEM:
        if path.exists():
            _MEM[key] = _load_npz(path)
        else:
            data = build()
            _atomic_save(path, data)
            _MEM[key] = data
    return _MEM[key]


def load_partition(spec: DataSpec, partition_id: int, cache_dir: str = "") -> ArrayData:
    """Partition `partition_id` of the train split as arrays (deterministic given the spec)."""
    if not 0 <= partition_id < spec.num_partitions:
        raise ValueError(f"partition-id {partition_id} out of range [0, {spec.num_partitions})")
    path = _cache_root(cache_dir) / _cache_name(spec.dataset) / spec.key() / f"part-{partition_id:05d}.npz"

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
    tag = hashlib.sha1(json.dumps([str(p.resolve()), _stat_signature(p), split, repr(info)]).encode()).hexdigest()[:16]

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
        except Exception as err:  # noqa: BLE001 - decoded only now: an image file that is not one, a cut Arrow file
            raise unreadable(where, err) from err

    return cached(_cache_root(cache_dir) / "local" / f"{tag}.npz", build)


def load_eval(spec: DataSpec, cache_dir: str = "") -> ArrayData:
    """The server's evaluation set: ``server-data-path`` (split ``test`` or its only split, in its own row order) if
    set, else the dataset's test split shuffled with the partition seed (in the hub's row order after the shuffle)."""
    info = spec.info
    if spec.server_data_path:
        return load_local_data(spec.server_data_path, info, f"run-config key 'server-data-path' = "
                               f"{spec.server_data_path!r}", split="test", cache_dir=cache_dir)
    extra = "" if not is_byo(spec.dataset) else _reference_token(spec.dataset) + repr(info)  # labels checked per info
    tag = hashlib.sha1((spec.data_dir + extra).encode()).hexdigest()[:8]
    path = _cache_root(cache_dir) / _cache_name(spec.dataset) / f"test-{spec.seed}-{tag}.npz"

    def build() -> ArrayData:
        if _resolve_source(spec) == "hub":
            return _from_hf(spec.dataset, _partitioner_for(spec).load_split("test"))
        test = source_arrays(spec)[1]
        if test is None:
            raise LocalDataError(f"run-config key 'dataset' = {spec.dataset!r}: has no split named 'test' for the "
                                 "server's evaluation; add one, or set run-config key 'server-data-path'")
        return _take(test, _row_index(info, test).shuffle(seed=spec.seed))

    return cached(path, build)


def load_test(name: str, source: str = "auto", data_dir: str = "", cache_dir: str = "", seed: int = 42) -> ArrayData:
    """The centralized test split of a named dataset (in the hub's row order after the shared shuffle)."""
    spec = DataSpec(dataset=name, source=source, data_dir=data_dir, partitioner="iid", num_partitions=1, seed=seed)
    return load_eval(spec, cache_dir)


def label_histogram(y: np.ndarray, num_classes: int) -> np.ndarray:
    """Per-class sample counts."""
    return np.bincount(y, minlength=num_classes)
