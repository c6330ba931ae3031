"""Frozen parameter objects: what a component reads from the run config, read once (docs/architecture.md#params).

A method's strategy and ClientApp handlers take its parameter object, not the flat run config, so a test or a
notebook builds one from a few values (``SHEFLParams(num_models=3)``) and a reader sees in one class which keys a
method reads. Each field names its run-config key with :func:`key`; ``from_config`` reads and converts them::

    @dataclass(frozen=True)
    class FedProxParams(MethodParams):
        mu: float = key("fedprox-mu", default=0.01)

:class:`FederationParams` holds the keys every strategy reads (seed, sampling fraction, round timeout).
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

P = TypeVar("P", bound="MethodParams")


def key(name: str, default: Any = dataclasses.MISSING, doc: str = "", *, parse: Callable[[Any], Any] | None = None,
        nested: type[MethodParams] | None = None, type: type | None = None, methods: tuple[str, ...] | None = None,
        **rules: Any) -> Any:
    """A field read from run-config key `name` (converted by ``parse(value)`` if given; `nested`: a parameter
    object of its own, built from the same config).

    With a `doc`, the field is also the key's one declaration (:func:`hetfl.common.config.keys_of` makes its
    :class:`~hetfl.common.config.Key`): `default` is then the run-config value (a field with `parse` defaults to
    ``parse(default)``), the key's type is the default's unless `type` says otherwise, `rules` are the Key's
    ``choices``, ``min``, ``max``, ``min_inclusive``, ``max_inclusive``, ``pattern``, ``pattern_doc``, and the key
    is read by the methods whose parameter object holds the field unless `methods` names them.
    """
    meta: dict[str, Any] = {"key": name, "parse": parse, "nested": nested}
    if doc:
        meta["declare"] = {"type": type or builtins.type(default), "default": default, "doc": doc, "methods": methods,
                           "rules": rules}
        if parse is not None:
            default = parse(default)
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class MethodParams:
    """Base of a frozen parameter object; subclasses declare fields with :func:`key`."""


    @classmethod
    def from_config(cls: type[P], cfg: Mapping[str, Any]) -> P:
        """Read every field's key from a validated run config."""
        kw = {}
        for f in fields(cls):
            meta = f.metadata
            if meta.get("nested") is not None:
                kw[f.name] = meta["nested"].from_config(cfg)
            elif meta.get("key"):
                value = cfg[meta["key"]]
                kw[f.name] = meta["parse"](value) if meta.get("parse") else value
        return cls(**kw)

    @classmethod
    def config_keys(cls) -> tuple[str, ...]:
        """The run-config keys this object reads (nested objects' included)."""
        out: list[str] = []
        for f in fields(cls):
            if f.metadata.get("nested") is not None:
                out += f.metadata["nested"].config_keys()
            elif f.metadata.get("key"):
                out.append(f.metadata["key"])
        return tuple(out)


@dataclass(frozen=True)
class NoParams(MethodParams):
    """A method that reads no keys of its own (FedAvg)."""


@dataclass(frozen=True)
class FederationParams(MethodParams):
    """What every strategy reads besides its method's parameters.

    Parameters
    ----------
    seed : int
        Seeds client sampling (with the client id) and the strategy's random draws.
    fraction_train : float
        Fraction of the known clients sampled per round.
    round_timeout : float
        Seconds to wait for a round's replies (also bounds node discovery).
    num_rounds : int
        Rounds of the run (some schedules depend on it).
    """

    seed: int = key("seed", 0)
    fraction_train: float = key("fraction-train", 0.1)
    round_timeout: float = key("round-timeout", 3600.0)
    num_rounds: int = key("num-server-rounds", 3)


def floats(sep: str = ",") -> Callable[[str], tuple[float, ...]]:
    """Parse a run-config list such as '0.66,0.40' (already checked by the method's config check)."""
    return lambda text: tuple(float(v) for v in str(text).split(sep)) if str(text).strip() else ()


def ints(sep: str = ",") -> Callable[[str], tuple[int, ...]]:
    """Parse a run-config list of integers such as '8,6,4'."""
    return lambda text: tuple(int(float(v)) for v in str(text).split(sep)) if str(text).strip() else ()


@dataclass(frozen=True)
class LocalSGDParams(MethodParams):
    """What a server must know of its clients' local SGD (FedNova's normaliser, Scaffold's control variates).

    Parameters
    ----------
    lr, lr_decay, lr_decay_every : float, float, int
        The local learning rate of round r is ``lr * lr_decay ** ((r - 1) // lr_decay_every)`` (docs/training.md).
    momentum : float
        Local SGD momentum rho.
    """

    lr: float = key("lr", 0.01)
    lr_decay: float = key("lr-decay", 1.0)
    lr_decay_every: int = key("lr-decay-every", 10)
    momentum: float = key("momentum", 0.0)

    def lr_at(self, server_round: int) -> float:
        """The local learning rate in round `server_round` (1-based)."""
        return self.lr * self.lr_decay ** ((max(server_round, 1) - 1) // self.lr_decay_every)


def apply_options(owner: str, options: Mapping[str, Any], *objects: P) -> tuple[P, ...]:
    """`objects` with the fields that keyword `options` name replaced: how a strategy takes its parameters as keyword
    arguments (``SHEFL(num_models=3, seed=1)``) while each is declared once, in its parameter object.

    Raises
    ------
    TypeError
        A keyword that no object has a field of, in one line with the allowed keywords.
    ValueError
        A value outside what the field's run-config key allows (its type, choices or range), in one line.
    """
    from .config import ConfigError, Key

    for o in objects:  # the declared fields' rules, as the run config's validation applies them
        for f in fields(o):
            d = f.metadata.get("declare")
            if f.name in options and d is not None and f.metadata.get("parse") is None:
                try:
                    Key(f.metadata["key"], d["type"], d["default"], d["doc"], **d["rules"]).check(options[f.name])
                except ConfigError as err:
                    raise ValueError(f"{owner}: {f.name}={options[f.name]!r} is not allowed; expected "
                                     f"{str(err).rsplit('expected ', 1)[-1]}") from None
    names = [{f.name for f in fields(o)} for o in objects]
    unknown = sorted(set(options) - set().union(*names))
    if unknown:
        allowed = ", ".join(sorted(set().union(*names)))
        raise TypeError(f"{owner}: unknown keyword argument {unknown[0]!r} = {options[unknown[0]]!r}; allowed: {allowed}")
    return tuple(dataclasses.replace(o, **{k: v for k, v in options.items() if k in n}) for o, n in zip(objects, names))
