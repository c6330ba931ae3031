"""Checkpoints that run no code on load: tensors in a safetensors file, everything else in JSON.

A checkpoint is a pair of files in one directory (format in docs/checkpoints.md):

- ``checkpoint.json``: ``{"format": "hetfl-checkpoint", "version": 1, "tensors": {"file", "bytes",
  "sha256"}, "state": <tree>}``, where ``<tree>`` is the state with every array replaced by a
  reference to a named tensor (:func:`split_state`);
- ``checkpoint-<label>-<random>.safetensors``: those tensors.

Atomicity: the JSON is the commit point. :func:`write_checkpoint` writes the tensors under a
fresh name nobody refers to yet, fsyncs them, writes the JSON to a temporary name, fsyncs it and
``os.replace``-s it over ``checkpoint.json``. A reader therefore sees the old pair or the new
pair, never a mix; the JSON names its tensor file and checks its size and SHA-256 on load. The
tensor file of the previous JSON survives one more save (for a reader that read the old JSON
just before the replace); older tensor files and leftovers of a crash are deleted. (Replacing a
whole directory is not atomic on POSIX when the target exists, hence "JSON names the tensors".)

No code runs on load: JSON and safetensors are plain data, and :func:`join_state` builds only
dicts, lists, tuples, numbers, strings, None, NumPy arrays and scalars and Flower ArrayRecords
from a closed set of tags; an unknown tag, an unreferenced or missing tensor, or a dtype that
could hold Python objects is a :class:`CheckpointError`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import sys
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord
from safetensors.numpy import load_file, save_file

FORMAT, VERSION = "hetfl-checkpoint", 1

# dtypes safetensors stores natively (little-endian); any other fixed-size dtype goes as raw bytes
_NATIVE = frozenset(np.dtype(t) for t in (np.float64, np.float32, np.float16, np.int64, np.uint64, np.int32, np.uint32,
                                          np.int16, np.uint16, np.int8, np.uint8, np.bool_, np.complex64))
_RAW_KINDS = "biufcmMUS"  # bool, ints, floats, complex, timedelta, datetime, str, bytes: never objects
_MAX_SAFE_INT = 2**53  # larger ints go as hex strings, exact for any JSON reader
_TENSOR_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors")
_HEX_INT = re.compile(r"-?0x[0-9a-f]+")


class CheckpointError(ValueError):
    """A checkpoint that is not a well-formed pair written by :func:`write_checkpoint`."""


# --- pure split / join ------------------------------------------------------------------------


def split_state(state: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """Split a nested state into (a JSON-able tree with tensor references, {name: ndarray}).

    Supported: dict (any hashable supported keys), list, tuple, None, bool, int (any size), float
    (nan/inf included), str, NumPy arrays (any shape, 0-d and empty included, numeric/bool/str
    dtypes) and scalars, Flower ``ArrayRecord``. Tags in the tree (one-key objects):
    ``$tuple``, ``$dict`` (keys that are not str or start with '$'), ``$float`` ('nan', 'inf',
    '-inf'), ``$int`` (hex, |i| >= 2**53), ``$array`` (tensor name), ``$raw`` (dtypes safetensors
    lacks: bytes in a uint8 tensor + dtype + shape), ``$scalar``, ``$arrayrecord``. Array subclasses
    come back as plain ndarrays and dict subclasses as dicts. TypeError names the path of anything else.
    """
    tensors: dict[str, np.ndarray] = {}
    return _split(state, (), tensors), tensors


def join_state(tree: Any, tensors: dict[str, np.ndarray]) -> Any:
    """Inverse of :func:`split_state`: the exact state (types, dtypes, shapes, values; arrays are writable copies).

    Raises CheckpointError on an unknown tag, a malformed tagged value, a missing tensor, or a
    tensor that the tree does not reference.
    """
    used: set[str] = set()
    out = _join(tree, tensors, used, ())
    unused = set(tensors) - used
    if unused:
        raise CheckpointError(f"tensors not referenced by the state: {sorted(unused)[:3]}")
    return out


def _where(path: tuple) -> str:
    return "/".join(str(p) for p in path) or "<root>"


def _name(path: tuple, tensors: dict[str, np.ndarray]) -> str:
    base = _where(path)
    name, i = base, 1
    while name in tensors or name == "__metadata__":
        i += 1
        name = f"{base}#{i}"
    return name


def _split_int(x: int) -> Any:
    return x if -_MAX_SAFE_INT < x < _MAX_SAFE_INT else {"$int": hex(x)}


def _split_float(x: float) -> Any:
    return x if math.isfinite(x) else {"$float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}


def _split_array(a: np.ndarray, path: tuple, tensors: dict[str, np.ndarray]) -> dict:
    a = np.asarray(a)  # a subclass -> ndarray
    name = _name(path, tensors)
    if a.dtype in _NATIVE and sys.byteorder == "little":
        tensors[name] = a if a.flags.c_contiguous else a.copy(order="C")
        return {"$array": name}
    if a.dtype.kind not in _RAW_KINDS or a.dtype.fields is not None or a.dtype.subdtype is not None:
        raise TypeError(f"checkpoint: array at {_where(path)} has dtype {a.dtype}; only numeric, bool and str dtypes")
    tensors[name] = np.frombuffer(a.tobytes(order="C"), np.uint8).copy()
    return {"$raw": {"tensor": name, "dtype": a.dtype.str, "shape": list(a.shape)}}


def _split(x: Any, path: tuple, tensors: dict[str, np.ndarray]) -> Any:
    if x is None or type(x) in (bool, str):
        return x
    if isinstance(x, np.generic):  # before int/float: np.float64 is a float, np.bool_ is neither
        if x.dtype.kind in "biuf" and x.dtype.itemsize <= 8:
            v = x.item()
            return {"$scalar": {"dtype": x.dtype.str, "value": _split(v, path, tensors)}}
        return {"$scalar": {"array": _split_array(np.asarray(x), path, tensors)}}
    if isinstance(x, str):  # a str subclass (a str Enum) comes back as str
        return str(x)
    if isinstance(x, int):  # an int subclass (IntEnum) comes back as int
        return _split_int(int(x))
    if isinstance(x, float):
        return _split_float(float(x))
    if isinstance(x, np.ndarray):
        return _split_array(x, path, tensors)
    if isinstance(x, ArrayRecord):
        return {"$arrayrecord": [[k, _split_array(v.numpy(), (*path, k), tensors)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"$tuple": [_split(v, (*path, i), tensors) for i, v in enumerate(x)]}
    if isinstance(x, list):
        return [_split(v, (*path, i), tensors) for i, v in enumerate(x)]
    if isinstance(x, dict):
        if all(type(k) is str and not k.startswith("$") for k in x):
            return {k: _split(v, (*path, k), tensors) for k, v in x.items()}
        return {"$dict": [[_split(k, (*path, "<key>"), tensors), _split(v, (*path, k if isinstance(k, str) else repr(k)), tensors)]
                          for k, v in x.items()]}
    raise TypeError(f"checkpoint: cannot store {type(x).__module__}.{type(x).__qualname__} at {_where(path)}")


def _dtype(s: Any, where: str) -> np.dtype:
    """A dtype from its string, refusing anything that could hold Python objects."""
    if not isinstance(s, str):
        raise CheckpointError(f"{where}: dtype must be a string, got {s!r}")
    try:
        dt = np.dtype(s)
    except TypeError as err:
        raise CheckpointError(f"{where}: unknown dtype {s!r}") from err
    if dt.kind not in _RAW_KINDS or dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        raise CheckpointError(f"{where}: dtype {s!r} is not allowed (only numeric, bool and str dtypes)")
    return dt


def _tensor(name: Any, tensors: dict[str, np.ndarray], used: set[str], where: str) -> np.ndarray:
    if not isinstance(name, str) or name not in tensors:
        raise CheckpointError(f"{where}: tensor {name!r} is not in the tensor file")
    used.add(name)
    return tensors[name]


def _join_array(v: Any, tensors: dict[str, np.ndarray], used: set[str], path: tuple) -> np.ndarray:
    where = _where(path)
    if not isinstance(v, dict) or len(v) != 1:
        raise CheckpointError(f"{where}: expected an array reference, got {v!r:.80}")
    (tag, body), = v.items()
    if tag == "$array":
        return np.array(_tensor(body, tensors, used, where), copy=True)
    if tag == "$raw":
        if not isinstance(body, dict) or set(body) != {"tensor", "dtype", "shape"}:
            raise CheckpointError(f"{where}: malformed $raw {body!r:.80}")
        dt = _dtype(body["dtype"], where)
        shape = body["shape"]
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise CheckpointError(f"{where}: malformed shape {shape!r:.80}")
        raw = _tensor(body["tensor"], tensors, used, where)
        n = math.prod(shape) * dt.itemsize
        if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size != n:
            raise CheckpointError(f"{where}: raw tensor of {raw.size} bytes for {n} bytes of {dt.str}{tuple(shape)}")
        return np.zeros(shape, dt) if n == 0 else np.frombuffer(raw.tobytes(), dt).reshape(shape).copy()
    raise CheckpointError(f"{where}: unknown array tag {tag!r}")


def _join(x: Any, tensors: dict[str, np.ndarray], used: set[str], path: tuple) -> Any:
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, list):
        return [_join(v, tensors, used, (*path, i)) for i, v in enumerate(x)]
    if not isinstance(x, dict):
        raise CheckpointError(f"{_where(path)}: unexpected JSON value of type {type(x).__name__}")
    if not any(k.startswith("$") for k in x):
        return {k: _join(v, tensors, used, (*path, k)) for k, v in x.items()}
    where = _where(path)
    if len(x) != 1:
        raise CheckpointError(f"{where}: a tagged value has exactly one key, got {sorted(x)[:4]}")
    (tag, body), = x.items()
    if tag in ("$array", "$raw"):
        return _join_array(x, tensors, used, path)
    if tag == "$tuple" and isinstance(body, list):
        return tuple(_join(v, tensors, used, (*path, i)) for i, v in enumerate(body))
    if tag == "$dict" and isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body):
        out = {}
        for k, v in body:
            key = _join(k, tensors, used, (*path, "<key>"))
            try:
                out[key] = _join(v, tensors, used, (*path, repr(key)))
            except TypeError as err:  # an unhashable key (a list)
                raise CheckpointError(f"{where}: unhashable dict key {key!r:.80}") from err
        return out
    if tag == "$float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "$int" and isinstance(body, str) and _HEX_INT.fullmatch(body):
        return int(body, 16)
    if tag == "$scalar" and isinstance(body, dict) and set(body) == {"dtype", "value"}:
        dt = _dtype(body["dtype"], where)
        value = _join(body["value"], tensors, used, path)
        if dt.kind not in "biuf" or type(value) not in (bool, int, float):
            raise CheckpointError(f"{where}: malformed $scalar {body!r:.80}")
        return dt.type(value)
    if tag == "$scalar" and isinstance(body, dict) and set(body) == {"array"}:
        a = _join_array(body["array"], tensors, used, path)
        if a.ndim != 0:
            raise CheckpointError(f"{where}: a $scalar array must be 0-d, got shape {a.shape}")
        return a[()]
    if tag == "$arrayrecord" and isinstance(body, list) and all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in body):
        return ArrayRecord({k: Array(_join_array(v, tensors, used, (*path, k))) for k, v in body})
    raise CheckpointError(f"{where}: unknown or malformed tag {tag!r} (value {body!r:.80})")


# --- the file pair ----------------------------------------------------------------------------


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # directories on some filesystems
        pass
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _strict_json(text: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise CheckpointError(f"duplicate JSON keys among {keys[:5]}")
        return dict(items)

    def constant(name: str) -> Any:
        raise CheckpointError(f"non-standard JSON constant {name} (non-finite floats are tagged $float)")

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"not valid JSON: {err}") from err


def _tensor_file_of(path: Path) -> str | None:
    """The tensor file the current JSON names (None when there is none or it is unreadable)."""
    try:
        name = json.loads(path.read_text())["tensors"]["file"]
        return name if isinstance(name, str) and _TENSOR_FILE.fullmatch(name) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def discard_checkpoint(path: Path | str) -> None:
    """Remove the checkpoint at `path` (``<dir>/<stem>.json``), its tensor files and its row log: a finished run
    needs none (its metrics.json says it finished), and a study's scored run that was committed mid-way drops it
    from the tree."""
    path = Path(path)
    for f in (path, *path.parent.glob(f"{path.stem}-*.safetensors"), *row_logs(path)):
        f.unlink(missing_ok=True)


def _lists(x: Any) -> Any:
    """`x` with NumPy arrays as (nested) lists."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_lists(v) for v in x)
    return x


def checkpoint_files(path: Path | str) -> list[Path]:
    """The files that make up the checkpoint at `path`, to copy or commit it: the tensor file its JSON names, its row
    log where it has one, and the JSON itself last (the commit point: copied last, a half-done copy is not read)."""
    path = Path(path)
    name = _tensor_file_of(path)
    if name is None:
        raise CheckpointError(f"{path}: not a checkpoint that names its tensor file")
    return [path.with_name(name), *row_logs(path), path]


def row_logs(path: Path | str) -> list[Path]:
    """The row logs beside the checkpoint at `path` (``<stem>-<random>-rows.jsonl``; a save leaves only its own)."""
    path = Path(path)
    return sorted(path.parent.glob(f"{path.stem}-*{ROW_LOG_SUFFIX[1:]}"))


# --- the row log: a growing history saved in time proportional to what it gained -----------------

ROW_LOG_SUFFIX = "-rows.jsonl"  # <stem>-<random>-rows.jsonl beside <stem>.json
_ROW_LOG_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*-rows\.jsonl")


class RowLog:
    """An append-only file of rows beside a checkpoint, one JSON line each, for a history that grows every round.

    A checkpoint that held its run's whole history in its JSON would cost time in proportion to the rows at every
    save, so a run's saves would cost time in proportion to the square of its rounds. Instead the checkpoint stores
    :meth:`mark` - the file's name, how many rows and bytes of it are this checkpoint's history, and their SHA-256
    (kept as a running hash) - and :meth:`extend` appends only the rows added since the last save, fsynced before
    the JSON that marks them is committed. A save that crashes between the two leaves rows past the mark: readers
    read only up to it, and the next save of the resumed run writes over them. Rows are encoded as a checkpoint's
    state is (:func:`split_state`: nan/inf, large ints, NumPy scalars, tuples), arrays as lists, and read back with
    the same checks.
    """

    def __init__(self, path: Path | str) -> None:
        """An empty log at `path` (a name ending in ``-rows.jsonl``): the first :meth:`extend` replaces any file there.
        :meth:`fresh` gives one a name no checkpoint refers to yet."""
        self.path = Path(path)
        if not _ROW_LOG_FILE.fullmatch(self.path.name):
            raise ValueError(f"row log {self.path.name!r}: expected a name ending in {ROW_LOG_SUFFIX}")
        self.rows, self.bytes, self._sha, self._fresh = 0, 0, hashlib.sha256(), True

    @classmethod
    def fresh(cls, checkpoint: Path | str) -> RowLog:
        """An empty log beside `checkpoint` under a fresh random name (``<stem>-<random>-rows.jsonl``): writing it
        cannot touch the log the current checkpoint marks (a run started over in a folder with a checkpoint), and
        the others go once the checkpoint that marks this one is committed (:func:`hetfl.common.rounds.save_checkpoint`)."""
        checkpoint = Path(checkpoint)
        return cls(checkpoint.with_name(f"{checkpoint.stem}-{secrets.token_hex(6)}{ROW_LOG_SUFFIX}"))

    def extend(self, rows: list[Any]) -> None:
        """Append `rows` and fsync them (an array in a row goes as the list metrics.json shows)."""
        lines = []
        for row in rows:
            tree, tensors = split_state(row)
            if tensors:  # an array in a row (a user's evaluate_fn)
                tree, tensors = split_state(_lists(row))
            lines.append(json.dumps(tree, allow_nan=False, separators=(",", ":")) + "\n")
        data = "".join(lines).encode()
        if not data and not self._fresh:
            return
        with open(self.path, "wb" if self._fresh else "r+b") as f:
            f.seek(self.bytes)  # after the rows this log wrote or opened: rows of a save that never committed go
            f.write(data)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
        self._fresh = False
        self._sha.update(data)
        self.rows, self.bytes = self.rows + len(rows), self.bytes + len(data)

    def mark(self) -> dict[str, Any]:
        """What a checkpoint stores to name the log's rows so far: ``{"file", "rows", "bytes", "sha256"}``."""
        return {"file": self.path.name, "rows": self.rows, "bytes": self.bytes, "sha256": self._sha.hexdigest()}

    @classmethod
    def open(cls, where: Path | str, mark: Any) -> tuple[RowLog, list[Any]]:
        """The log in directory `where` as `mark` left it, positioned to append after it, and its rows (the file is
        only read: rows past the mark are overwritten by the log's first :meth:`extend`).

        CheckpointError if the mark is malformed, names a path, or the file is shorter than the mark or differs
        from it (size, SHA-256, row count) or holds a row that is not the checkpoint format's plain data.
        """
        if (not isinstance(mark, dict) or set(mark) != {"file", "rows", "bytes", "sha256"}
                or not isinstance(mark["file"], str) or not _ROW_LOG_FILE.fullmatch(mark["file"])
                or type(mark["rows"]) is not int or type(mark["bytes"]) is not int or mark["bytes"] < 0):
            raise CheckpointError(f"malformed row-log mark {mark!r:.160}")
        log = cls(Path(where) / mark["file"])
        try:
            with open(log.path, "rb") as f:
                data = f.read(mark["bytes"])
        except FileNotFoundError:
            raise CheckpointError(f"{log.path}: the row log the checkpoint names is missing") from None
        if len(data) != mark["bytes"] or hashlib.sha256(data).hexdigest() != mark["sha256"]:
            raise CheckpointError(f"{log.path}: does not match the size/SHA-256 the checkpoint records")
        lines = data.decode().splitlines()
        if len(lines) != mark["rows"] or (data and not data.endswith(b"\n")):
            raise CheckpointError(f"{log.path}: {len(lines)} rows where the checkpoint records {mark['rows']}")
        rows = [join_state(_strict_json(line), {}) for line in lines]
        log.rows, log.bytes, log._fresh = len(rows), len(data), False
        log._sha.update(data)
        return log, rows


def write_checkpoint(path: Path | str, state: Any, label: str = "") -> Path:
    """Atomically replace the checkpoint at `path` (``<dir>/<stem>.json``) by `state`; returns the tensor file.

    Parameters
    ----------
    label : str
        Goes into the tensor file's name for humans (e.g. ``r00004``); letters, digits, '.', '_', '-'.
    """
    path = Path(path)
    tree, tensors = split_state(state)
    stem = path.stem
    name = f"{stem}-{label + '-' if label else ''}{secrets.token_hex(6)}.safetensors"
    if not _TENSOR_FILE.fullmatch(name):
        raise ValueError(f"checkpoint label {label!r}: use letters, digits, '.', '_', '-'")
    tensor_path = path.with_name(name)
    save_file(tensors, tensor_path)  # a fresh name: invisible to readers until the JSON names it
    _fsync(tensor_path)
    doc = {"format": FORMAT, "version": VERSION,
           "tensors": {"file": name, "bytes": tensor_path.stat().st_size, "sha256": _sha256(tensor_path)},
           "state": tree}
    previous = _tensor_file_of(path)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, allow_nan=False, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # the commit point
    _fsync(path.parent)
    keep = {name, previous}
    for old in path.parent.glob(f"{stem}-*.safetensors"):
        if old.name not in keep:
            old.unlink(missing_ok=True)
    for old in path.parent.glob(f"{path.name}.*.tmp"):
        old.unlink(missing_ok=True)
    return tensor_path


def _read_document(path: Path) -> dict[str, Any]:
    """The checkpoint's JSON document, its format and keys checked (its tensor file is not opened)."""
    doc = _strict_json(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a {FORMAT} file")
    if doc.get("version") != VERSION or set(doc) != {"format", "version", "tensors", "state"}:
        raise CheckpointError(f"{path}: unsupported version {doc.get('version')!r} or keys {sorted(doc)}")
    return doc


def read_checkpoint_entry(path: Path | str, name: str, default: Any = None) -> Any:
    """Entry `name` of a checkpoint whose state is a dict, read from the JSON alone: the tensor file is neither read
    nor checked (e.g. the settings an ensemble records, without its models). `default` if the state has no such
    entry; CheckpointError if the JSON is not a checkpoint or the entry refers to tensors."""
    path = Path(path)
    state = _read_document(path)["state"]
    if not isinstance(state, dict) or name not in state:
        return default
    try:
        return join_state(state[name], {})
    except CheckpointError as err:
        raise CheckpointError(f"{path}: entry {name!r} is not plain JSON data ({err})") from None


def read_checkpoint(path: Path | str) -> Any:
    """The state saved by :func:`write_checkpoint` at `path`; CheckpointError if the pair is not well formed."""
    path = Path(path)
    doc = _read_document(path)
    meta = doc["tensors"]
    if not isinstance(meta, dict) or set(meta) != {"file", "bytes", "sha256"}:
        raise CheckpointError(f"{path}: malformed 'tensors' entry {meta!r:.120}")
    name = meta["file"]
    if not isinstance(name, str) or not _TENSOR_FILE.fullmatch(name):
        raise CheckpointError(f"{path}: tensor file name {name!r:.80} is not a plain *.safetensors name")
    tensor_path = path.with_name(name)
    if not tensor_path.is_file():
        raise CheckpointError(f"{path}: its tensor file {name} is missing")
    if tensor_path.stat().st_size != meta["bytes"] or _sha256(tensor_path) != meta["sha256"]:
        raise CheckpointError(f"{path}: tensor file {name} does not match the size/SHA-256 the JSON records")
    try:
        tensors = load_file(tensor_path)
    except Exception as err:  # safetensors raises its own SafetensorError
        raise CheckpointError(f"{tensor_path}: not a valid safetensors file: {err}") from err
    return join_state(doc["state"], tensors)
