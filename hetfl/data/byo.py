"""Bring your own dataset (docs/bring-your-own.md, docs/node-data.md): references, directories and their content
identity, class names, descriptions, and the one error for data that does not fit the run.

Besides the named datasets of :data:`~hetfl.data.catalog.DATASETS`, a run may bring its own:
``dataset = "hub:<id>[:<subset>]"`` or ``dataset = "dir:<directory>"``, with the columns named by ``input-column`` /
``label-column``. Such a *reference* is read with the `datasets` readers (:func:`read_directory`,
:func:`read_reference`) and described from its features and first row (:func:`describe`). A SuperNode started with
``--node-config 'data-path="<dir>"'`` trains on that directory alone, read the same way and checked against the run's
description; so is the server's ``server-data-path``. Data that does not fit raises one :class:`LocalDataError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from .cache import cache_root
from .catalog import DatasetInfo, DatasetUnavailable


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


def unreadable(where: str, err: Exception) -> LocalDataError:
    """The one line for data a reader could not read (a file that is no dataset, cut short, or not an image)."""
    first = str(err).splitlines()[0] if str(err) else ""
    return LocalDataError(f"{where}: could not be read as a dataset ({type(err).__name__}: {first}); expected a "
                          "directory written by Dataset.save_to_disk, an image folder (one subfolder of images per "
                          "class) or Parquet/CSV/JSON files")


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


def reference_token(name: str) -> str:
    """What identifies a reference's content for the partition cache: the hub id, or the directory's file sizes and
    mtimes."""
    kind, ref, _ = parse_reference(name)
    return stat_signature(Path(ref)) if kind == "dir" and Path(ref).is_dir() else name


def _dataset_files(path: Path) -> list[Path]:
    """The regular files of a directory tree that make up its data, sorted (hidden files and ``state.json``
    (whose `_fingerprint` save_to_disk draws at random) left out)."""
    return sorted(f for f in path.rglob("*") if f.is_file() and f.name != "state.json"
                  and not any(part.startswith(".") for part in f.relative_to(path).parts))


def stat_signature(path: Path) -> str:
    """Cheap identity of a directory's current content: (relative path, size, mtime) of every data file."""
    h = hashlib.sha1(str(path.resolve()).encode())
    for f in _dataset_files(path):
        st = f.stat()
        h.update(f"{f.relative_to(path).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=32)
def _content_digest(path: str, signature: str) -> str:
    stored = cache_root("") / "digests" / f"{signature}.txt"  # a deployed ClientApp process may live one message
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
    return _content_digest(str(p.resolve()), stat_signature(p))


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
    except Exception as err:  # the readers raise many types for unreadable content
        raise unreadable(where, err) from err
    return out if isinstance(out, datasets.DatasetDict) else datasets.DatasetDict({"train": out})


def choose_split(dd, want: str, where: str):
    """Split `want` of a DatasetDict, or its only split; LocalDataError naming the splits found otherwise."""
    if want in dd:
        return dd[want]
    if len(dd) == 1:
        return next(iter(dd.values()))
    raise LocalDataError(f"{where}: holds the splits {sorted(dd)}; expected a split named {want!r} (or a single split)")


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
    except Exception as err:  # network/hub errors come in many types
        raise DatasetUnavailable(f"{where}: could not be loaded from the Hugging Face hub or its cache "
                                 f"({type(err).__name__}: {err})") from err


def image_shape(x: np.ndarray) -> tuple[int, ...]:
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

    where = where or f"run-config key 'dataset' = {name!r}"
    cols = list(ds.column_names)
    icol, lcol = _input_column(cols, input_col), label_col or "label"
    if icol is None and not input_col and lcol in cols and (features := tabular_features(ds, lcol)):
        return _describe_table(ds, features, lcol, num_classes, where, run)
    if icol is None or icol not in cols:
        wanted = f"{icol!r} (input-column)" if icol else (f"one of {INPUT_COLUMNS} (or name it with input-column), or "
                                                          "numeric feature columns beside the label (a table)")
        raise LocalDataError(f"{where}: has the columns {cols}; expected an input column {wanted}")
    if lcol not in cols:
        raise LocalDataError(f"{where}: has the columns {cols}; expected a label column {lcol!r} (label-column)")
    if len(ds) == 0:
        raise LocalDataError(f"{where}: holds no rows; expected at least one labelled example")
    found, names = _label_feature(ds, lcol, where)
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


def tabular_features(ds, label_col: str) -> tuple[str, ...]:
    """A table's feature columns: every numeric column (integers, floats, booleans) but the label, in file order."""
    from datasets import Value

    return tuple(c for c in ds.column_names if c != label_col and isinstance(ds.features[c], Value)
                 and ds.features[c].dtype.startswith(("int", "uint", "float", "bool")))


def _label_feature(ds, lcol: str, where: str) -> tuple[int | None, tuple[str, ...]]:
    """(class count of a ClassLabel or None for plain integers, its class names) of a split's label column;
    LocalDataError for a label column of another type."""
    from datasets import ClassLabel

    try:
        found = _label_classes(ds.features[lcol])
    except ValueError:
        raise LocalDataError(f"{where}: label column {lcol!r} is {ds.features[lcol]}; expected integer class ids "
                             "(a ClassLabel or int column)") from None
    return found, tuple(ds.features[lcol].names) if isinstance(ds.features[lcol], ClassLabel) else ()


def check_features(found: Sequence[str], expected: Sequence[str], label_col: str, where: str) -> None:
    """A table's feature columns must be exactly the run's (any order); one LocalDataError line naming both lists."""
    missing, extra = [f for f in expected if f not in found], [f for f in found if f not in expected]
    if missing or extra:
        raise LocalDataError(f"{where}: its feature columns differ from the run's (missing {missing}, extra {extra}); "
                             f"expected exactly {list(expected)} beside the label {label_col!r}")


def _describe_table(ds, features: tuple[str, ...], lcol: str, num_classes: int, where: str,
                    run: DatasetInfo | None) -> DatasetInfo:
    """A table (CSV or Parquet with a label column): F numeric features standardised with the mean and standard
    deviation of this split (the server's train split; a node with its own data takes the run's, and must hold
    exactly the run's feature columns)."""
    from dataclasses import replace


    if run is not None:
        if run.kind != "tabular":
            raise LocalDataError(f"{where}: holds a table (numeric columns {list(features)}); the run expects "
                                 f"{run.kind} inputs")
        check_features(features, run.features, lcol, where)
        return replace(run, label_col=lcol)
    found, names = _label_feature(ds, lcol, where)
    names = () if is_integer_names(names) else names
    if len(ds) == 0:
        raise LocalDataError(f"{where}: holds no rows; expected at least one labelled example")
    labels = np.asarray(ds.with_format("numpy", columns=[lcol])[:][lcol])
    n = num_classes or found or int(labels.max()) + 1
    x = np.stack([np.asarray(ds.with_format("numpy", columns=[f])[:][f], dtype=np.float64) for f in features], 1)
    if not np.all(np.isfinite(x)):
        raise LocalDataError(f"{where}: feature column(s) {[f for f, ok in zip(features, np.isfinite(x).all(0)) if not ok]} "
                             "hold missing or infinite values; expected a number in every cell")
    mean, std = x.mean(0), x.std(0)
    std = np.where(std > 0, std, 1.0)
    return DatasetInfo("", "", lcol, int(n), (len(features),), tuple(float(v) for v in mean),
                       tuple(float(v) for v in std), BYO_THRESHOLD, kind="tabular", class_names=names,
                       features=features)


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
    shape = image_shape(first)
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
