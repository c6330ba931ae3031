"""A split in memory (:class:`ArrayData`) and its row index: the labels and row positions that shuffling and the
partitioners pick rows from (:func:`row_index`), and the rows they picked taken from the arrays (:func:`take`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .catalog import DatasetInfo


@dataclass
class ArrayData:
    """A split as arrays: x uint8 (N, C, H, W) images (or object array of str), y int64 (N,)."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


def label_histogram(y: np.ndarray, num_classes: int) -> np.ndarray:
    """Per-class sample counts."""
    return np.bincount(y, minlength=num_classes)


ROW = "hetfl_row"  # the column of a row index dataset: the row's position in the local arrays


def row_index(info: DatasetInfo, split: ArrayData):
    """A split as a datasets.Dataset of its labels and row positions, without the images.

    Shuffling (a permutation drawn from the seed and the length alone), the Divider and the
    partitioners read nothing but the label column, so they pick the same rows as on the full
    dataset; :func:`take` then takes those rows from the arrays. Skipping the image column
    saves the Arrow round trip of every image (seconds per ClientApp process).
    """
    from datasets import ClassLabel, Dataset, Features, Value

    feats = Features({info.label_col: ClassLabel(num_classes=info.num_classes), ROW: Value("int64")})
    return Dataset.from_dict({info.label_col: split.y, ROW: np.arange(len(split.y), dtype=np.int64)}, features=feats)


def column(ds, name: str) -> np.ndarray:
    """One column of a datasets.Dataset as a NumPy array, read in one batch (not row by row)."""
    return np.asarray(ds.with_format("numpy", columns=[name])[:][name])


def take(split: ArrayData, index) -> ArrayData:
    """The rows of `split` that a row index dataset (or a part of one) names, in its order."""
    rows = column(index, ROW).astype(np.int64)  # an empty partition's column comes back as float64
    return ArrayData(split.x[rows], split.y[rows])
