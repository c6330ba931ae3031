"""A :class:`datasets.Dataset` split as :class:`~hetfl.data.arrays.ArrayData` that fits the run's
:class:`~hetfl.data.catalog.DatasetInfo` (columns, input shape, pixel range, labels as the run's class ids), and
arrays back as a Dataset with the dataset's columns (what ``python -m hetfl.export`` saves)."""

from __future__ import annotations

import numpy as np

from .arrays import ArrayData
from .byo import LocalDataError, class_ids, image_shape, is_integer_names
from .catalog import DatasetInfo
from .info import dataset_info


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
    if info.kind == "tabular":
        return _table_arrays(ds, info, where, allow_empty)
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
        shapes = sorted({image_shape(np.asarray(i)) for i in x})
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


def _table_arrays(ds, info: DatasetInfo, where: str, allow_empty: bool) -> ArrayData:
    """A table's rows as float32 features (N, F) in the run's feature order and int64 labels; LocalDataError for a
    missing or extra feature column, a non-numeric or missing value, or a label the run does not know."""
    from .byo import check_features, tabular_features

    cols = list(ds.column_names)
    if info.label_col not in cols:
        raise LocalDataError(f"{where}: has the columns {cols}; the run expects a label column {info.label_col!r}")
    check_features(tabular_features(ds, info.label_col), info.features, info.label_col, where)
    if len(ds) == 0:
        if not allow_empty:
            raise LocalDataError(f"{where}: holds no rows; the run expects at least one labelled example")
        return ArrayData(np.zeros((0, len(info.features)), np.float32), np.zeros(0, np.int64))
    data = ds.with_format("numpy", columns=[*info.features, info.label_col])[:]
    x = np.stack([np.asarray(data[f], dtype=np.float32) for f in info.features], 1)
    if not np.all(np.isfinite(x)):
        bad = [f for f, ok in zip(info.features, np.isfinite(x).all(0), strict=True) if not ok]
        raise LocalDataError(f"{where}: feature column(s) {bad} hold missing or infinite values; expected a number in "
                             "every cell")
    y = np.asarray(data[info.label_col])
    if y.dtype.kind not in "iu":
        raise LocalDataError(f"{where}: label column {info.label_col!r} holds {y.dtype} values; the run expects "
                             f"integer class ids in [0, {info.num_classes})")
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


def to_hf(dataset: str | DatasetInfo, split: ArrayData):
    """Wrap arrays as a datasets.Dataset with the dataset's column names (images as Array2D/Array3D HWC, labels as
    a ClassLabel): what :func:`to_arrays` turns back into the same arrays."""
    from datasets import Array2D, Array3D, ClassLabel, Dataset, Features, Value

    info = dataset_info(dataset) if isinstance(dataset, str) else dataset
    named = len(info.class_names) == info.num_classes
    label = ClassLabel(names=list(info.class_names)) if named else ClassLabel(num_classes=info.num_classes)
    if info.kind == "text":
        feats = Features({info.image_col: Value("string"), info.label_col: label})
        return Dataset.from_dict({info.image_col: [str(t) for t in split.x], info.label_col: split.y}, features=feats)
    if info.kind == "tabular":
        feats = Features({**{f: Value("float32") for f in info.features}, info.label_col: label})
        return Dataset.from_dict({**{f: split.x[:, j] for j, f in enumerate(info.features)}, info.label_col: split.y},
                                 features=feats)
    c, h, w = info.shape
    if c == 1:
        feats = Features({info.image_col: Array2D((h, w), "uint8"), info.label_col: label})
        x = split.x[:, 0]
    else:  # stored HWC like decoded hub images
        feats = Features({info.image_col: Array3D((h, w, c), "uint8"), info.label_col: label})
        x = np.transpose(split.x, (0, 2, 3, 1))
    return Dataset.from_dict({info.image_col: x, info.label_col: split.y}, features=feats)


def from_hf(dataset: str | DatasetInfo, ds) -> ArrayData:
    """Convert a (hub or local) datasets.Dataset split to ArrayData (NCHW uint8); see :func:`to_arrays`."""
    info = dataset_info(dataset) if isinstance(dataset, str) else dataset
    return to_arrays(ds, info, f"dataset {dataset if isinstance(dataset, str) else info.hub_id or 'split'!r}")
