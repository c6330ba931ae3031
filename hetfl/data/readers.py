"""The named datasets' own files as arrays in the hub's row order: IDX (MNIST, Fashion-MNIST), CIFAR pickles, SVHN
.mat, AG News CSV and scikit-learn's digits; and where they are looked for (``data-dir``, the catalog's
``local_dirs``)."""

from __future__ import annotations

import csv
import gzip
import pickle
from pathlib import Path

import numpy as np

from .arrays import ArrayData
from .byo import is_byo, parse_reference
from .catalog import DATASETS


def _read_idx(path: Path) -> np.ndarray:
    """One IDX file, plain or gzipped, as uint8.

    torchvision.datasets.mnist's read_image_file / read_label_file give the same arrays byte for byte, but open plain
    files only, and IDX files come gzipped (Debian's dataset-fashion-mnist, the MNIST download): kept for those."""
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


def local_dirs(name: str, data_dir: str) -> list[Path]:
    """The existing directories where a named dataset's files are looked for: data-dir/<name>, data-dir, the catalog's."""
    dirs = []
    if data_dir:
        dirs += [Path(data_dir) / name, Path(data_dir)]
    dirs += [Path(p) for p in DATASETS[name].local_dirs]
    return [d for d in dirs if d.is_dir()]


def _idx_arrays(dirs: list[Path]) -> tuple[ArrayData, ArrayData] | None:
    """(Fashion-)MNIST: the four IDX files (train/t10k images and labels), plain or gzipped."""
    def idx_file(stem: str, dim: int) -> Path | None:  # both spellings in use: train-images-idx3-ubyte / .idx3-
        return _find(dirs, [f"{stem}-idx{dim}-ubyte", f"{stem}.idx{dim}-ubyte"])

    files = {"trx": idx_file("train-images", 3), "try": idx_file("train-labels", 1),
             "tex": idx_file("t10k-images", 3), "tey": idx_file("t10k-labels", 1)}
    if any(v is None for v in files.values()):
        return None
    tr = ArrayData(_read_idx(files["trx"])[:, None], _read_idx(files["try"]).astype(np.int64))
    te = ArrayData(_read_idx(files["tex"])[:, None], _read_idx(files["tey"]).astype(np.int64))
    return tr, te


def _cifar_arrays(name: str, dirs: list[Path]) -> tuple[ArrayData, ArrayData] | None:
    """CIFAR-10/100: the pickled batches of cifar-10-python.tar.gz / cifar-100-python.tar.gz, extracted.

    torchvision's CIFAR10/CIFAR100 read these pickles too, but only after checking every file's MD5 against the
    official archive (and with batches.meta present), and offer no reader of a batch file alone: this reads any batch
    of the layout (the same arrays for the official files, NCHW where torchvision turns them NHWC)."""
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
        return _read_cifar(train_files, key), _read_cifar(test_files, key)
    return None


def _read_cifar(files: list[Path], key: bytes) -> ArrayData:
    xs, ys = [], []
    for f in files:
        with open(f, "rb") as fh:
            b = pickle.load(fh, encoding="bytes")
        xs.append(np.asarray(b[b"data"], np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(b[key], np.int64))
    return ArrayData(np.concatenate(xs), np.concatenate(ys))


def _split_files(dirs: list[Path], train: str, test: str, read) -> tuple[ArrayData, ArrayData] | None:
    """(train, test) read from the files named `train` and `test` in the first of `dirs` holding them, else None."""
    tr, te = _find(dirs, [train]), _find(dirs, [test])
    if tr is None or te is None:
        return None
    return read(tr), read(te)


def _svhn_arrays(dirs: list[Path]) -> tuple[ArrayData, ArrayData] | None:
    """SVHN (cropped digits): train_32x32.mat and test_32x32.mat."""
    return _split_files(dirs, "train_32x32.mat", "test_32x32.mat", _read_svhn)


def _read_svhn(p: Path) -> ArrayData:
    """One .mat file through scipy.io.loadmat, as torchvision's SVHN reads it (which accepts the official files' MD5
    only)."""
    from scipy.io import loadmat

    m = loadmat(p)
    y = m["y"].reshape(-1).astype(np.int64)
    y[y == 10] = 0  # the hub's convention: digit 0 has label 0
    return ArrayData(np.transpose(m["X"], (3, 2, 0, 1)).astype(np.uint8), y)


def _ag_news_arrays(dirs: list[Path]) -> tuple[ArrayData, ArrayData] | None:
    """AG News: train.csv and test.csv (class index 1-4, title, description)."""
    return _split_files(dirs, "train.csv", "test.csv", _read_ag_news)


def _read_ag_news(p: Path) -> ArrayData:
    texts, labels = [], []
    with open(p, newline="", encoding="utf-8") as fh:
        for row in csv.reader(fh):
            if not row or not row[0].strip().isdigit():
                continue  # header
            labels.append(int(row[0]) - 1)
            texts.append(" ".join(s.strip() for s in row[1:]))
    return ArrayData(np.asarray(texts, dtype=object), np.asarray(labels, np.int64))


def _digits_arrays() -> tuple[ArrayData, ArrayData]:
    """scikit-learn's digits, scaled to 0..255, split 80/20 by class with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = np.clip(d.images * 16, 0, 255).astype(np.uint8)[:, None]  # 0..16 -> 0..255
    xtr, xte, ytr, yte = train_test_split(x, d.target.astype(np.int64), test_size=0.2, random_state=0, stratify=d.target)
    return ArrayData(xtr, ytr), ArrayData(xte, yte)


def read_local(name: str, data_dir: str) -> tuple[ArrayData, ArrayData] | None:
    """Read the train and test splits from local files; None if not found."""
    dirs = local_dirs(name, data_dir)
    if name in ("fashion_mnist", "mnist"):
        return _idx_arrays(dirs)
    if name in ("cifar10", "cifar100"):
        return _cifar_arrays(name, dirs)
    if name == "svhn":
        return _svhn_arrays(dirs)
    if name == "ag_news":
        return _ag_news_arrays(dirs)
    if name == "digits":
        return _digits_arrays()
    raise KeyError(name)


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
    return _find(local_dirs(name, data_dir), _LOCAL_MARKERS[name]) is not None
