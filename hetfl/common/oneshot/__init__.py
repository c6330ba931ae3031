"""One-shot phase 1, shared by FENS and its one-shot baselines (FENS Sec. 3.1): every client trains a model once and
uploads it (:mod:`.client`, :mod:`.server`); the uploads form an :class:`~.ensemble.Ensemble` that a run saves and a
later run may start from (:mod:`.artifacts`). What differs per method is declared by its :class:`Phase1`."""

from dataclasses import dataclass
from typing import Any

from hetfl.common.config import Key


@dataclass(frozen=True)
class Phase1:
    """A method's phase 1: the message its clients answer and the run-config keys that, with
    :data:`.artifacts.PHASE1_KEYS`, decide the models it trains (docs/readings.md#fens-artifacts).

    Parameters
    ----------
    message : str
        The phase-1 message type (``train.fens_local``: FENS's 90% split; ``train.oneshot_local``: all of a client's
        data).
    keys : tuple of Key
        The method's own keys that change what phase 1 trains (declared by its parameter object).
    legacy_method : str
        The method whose runs saved ensembles before the settings were recorded ("fens"): such an ensemble takes its
        settings from that run's config. "" = none.
    reuse_key : str
        The run-config key that starts a run from a saved ensemble of this phase 1 (``fens-reuse``,
        ``oneshot-reuse``); "" = none. A search over keys phase 1 does not read trains phase 1 once through it
        (:func:`hetfl.tune.phase1_once`).
    """

    message: str
    keys: tuple[Key, ...] = ()
    legacy_method: str = ""
    reuse_key: str = ""

    @property
    def key_names(self) -> tuple[str, ...]:
        """The names of :attr:`keys`."""
        return tuple(k.name for k in self.keys)

    def defaults(self) -> dict[str, Any]:
        """:attr:`keys` at their defaults."""
        return {k.name: k.default for k in self.keys}
