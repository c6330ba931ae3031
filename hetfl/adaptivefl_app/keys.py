"""Run-config keys and parameters of AdaptiveFL and the baselines built from its code (one variants table)."""

from dataclasses import dataclass

from hetfl.common.config import ConfigError, keys_of
from hetfl.common.models import MODELS, PRUNABLE
from hetfl.common.nodeconfig import NodeKey, is_positive_number, quoted
from hetfl.common.params import MethodParams, floats, ints, key


@dataclass(frozen=True)
class Variant:
    """A method built from AdaptiveFL's code (docs/readings.md#adaptivefl-baselines).

    Parameters
    ----------
    name : str
        The run-config ``method``.
    pool : {"adaptivefl", "heterofl", "scalefl"}
        Which submodel levels it dispatches: AdaptiveFL's fine-grained pool, HeteroFL's uniform widths fitted to
        the tiers, ScaleFL's width-and-depth levels with early exits.
    plan : {"adaptivefl", "level", "decoupled", "all-large"}
        How a round is planned: RandomSel + the RL ClientSel (Alg. 1); a uniform level then a client that affords
        it; every level its own K affordable clients; the full model on K random clients.
    prune : bool
        Devices prune what they receive to their capacity (AdaptiveFL only; the others send what fits).
    knows_tiers : bool
        The server is told each client's device tier when it discovers the clients.
    models : int
        Global models the server keeps (Decoupled: one per level).
    """

    name: str
    pool: str
    plan: str
    prune: bool = False
    knows_tiers: bool = True
    models: int = 1


VARIANTS = {v.name: v for v in (
    Variant("adaptivefl", pool="adaptivefl", plan="adaptivefl", prune=True, knows_tiers=False),
    Variant("heterofl", pool="heterofl", plan="level"),
    Variant("scalefl", pool="scalefl", plan="level"),
    Variant("decoupled", pool="adaptivefl", plan="decoupled", models=3),
    Variant("all-large", pool="adaptivefl", plan="all-large", knows_tiers=False),
)}
"""method name -> Variant: AdaptiveFL and the baselines of its Sec. 4 (Jia et al. 2024)."""
NAMES = tuple(VARIANTS)
SELECTION = ("rl", "curiosity", "resource", "random")
TIERS = ("weak", "medium", "strong")  # device tiers (Sec. 4.1), smallest first
DEFAULT_EXITS = {"cnn": (2, 3), "vgg16": (8, 10)}  # ScaleFL: hidden layers followed by an early exit (VGG16: the authors')
CAPACITY = NodeKey("capacity", "AdaptiveFL: this device's tier or its budget in model parameters (a real device declares "
            "it; simulation draws the tier from adaptivefl-tier-proportions)",
            f"one of {quoted(TIERS)} or a number of parameters > 0",
            lambda v: (isinstance(v, str) and v in TIERS) or is_positive_number(v))
NODE_KEYS = (CAPACITY,)


def parse_floats(cfg: dict, key: str, sep: str = ",") -> tuple[float, ...]:
    """A run-config list such as '0.66,0.40' or '4:3:3' as floats (the parameter objects' :func:`floats`), with an
    error naming the key."""
    try:
        return floats(sep)(cfg[key])
    except ValueError:
        raise ConfigError(f"run-config key '{key}' = {cfg[key]!r}: expected numbers separated by '{sep}'") from None


def check(cfg: dict) -> None:
    """AdaptiveFL's whole-config checks (ratios, start layers, device proportions, a prunable model)."""
    if cfg["method"] not in VARIANTS:
        return
    ratios = parse_floats(cfg, "adaptivefl-ratios")
    if len(ratios) != 2 or not 1.0 > ratios[0] > ratios[1] > 0.0:
        raise ConfigError(f"run-config key 'adaptivefl-ratios' = {cfg['adaptivefl-ratios']!r}: expected 'r_M,r_S' "
                          "with 1 > r_M > r_S > 0 (paper: '0.66,0.40')")
    starts = parse_floats(cfg, "adaptivefl-starts")
    if any(s != int(s) or s < 0 for s in starts):
        raise ConfigError(f"run-config key 'adaptivefl-starts' = {cfg['adaptivefl-starts']!r}: expected "
                          "non-negative layer indices such as '8,6,4' ('' = the model's default)")
    props = parse_floats(cfg, "adaptivefl-tier-proportions", ":")
    if len(props) != 3 or min(props) < 0 or sum(props) <= 0:
        raise ConfigError(f"run-config key 'adaptivefl-tier-proportions' = {cfg['adaptivefl-tier-proportions']!r}: expected "
                          "'weak:medium:strong' with non-negative numbers, e.g. '4:3:3'")
    if cfg["method"] == "scalefl":
        exits = parse_floats(cfg, "scalefl-exits")
        if cfg["model"] not in DEFAULT_EXITS:
            raise ConfigError(f"run-config key 'model' = {cfg['model']!r}: the ScaleFL baseline needs a conv/FC stack; "
                              f"expected one of {tuple(DEFAULT_EXITS)}")
        if exits and (len(exits) != 2 or exits[0] >= exits[1] or exits[0] < 1 or any(e != int(e) for e in exits)):
            raise ConfigError(f"run-config key 'scalefl-exits' = {cfg['scalefl-exits']!r}: expected two increasing "
                              "hidden-layer indices such as '8,10' ('' = the model's default)")
    if cfg["model"] not in MODELS or not MODELS[cfg["model"]].prunable:
        raise ConfigError(f"run-config key 'model' = {cfg['model']!r}: AdaptiveFL needs a width-prunable model; "
                          f"expected one of {PRUNABLE}")



RENAMED = {"device-proportions": "adaptivefl-tier-proportions", "device-capacity": "adaptivefl-tier-capacity",
           "adaptivefl-variant": " the baselines are methods of their own: method = 'heterofl', 'scalefl', 'decoupled' "
                                 "or 'all-large' (AdaptiveFL: method = 'adaptivefl')"}


@dataclass(frozen=True)
class AdaptiveFLParams(MethodParams):
    """AdaptiveFL's parameters, and its baselines' (Sec. 3-4; docs/readings.md#adaptivefl).

    Parameters
    ----------
    variant : Variant
        The method (``VARIANTS``): AdaptiveFL or a baseline from the same code.
    selection : {"rl", "curiosity", "resource", "random"}
        AdaptiveFL's ClientSel rewards (Sec. 3.3); the ablations +C, +S, +Random.
    dispatch : {"random", "largest"}
        The model of each slot: RandomSel over the pool, or always L1 (+Greed).
    ratios : tuple of float
        Width ratios (r_M, r_S) of the M and S levels.
    starts : tuple of int
        Start layers I_1 > .. > I_p (empty = the model's default).
    tau : int
        Shallow-layer threshold: a start layer I >= tau.
    tier_proportions : tuple of float
        weak : medium : strong devices of a simulation.
    tier_capacity : {"gaussian", "fixed"}
        A tier's capacity per request: the authors' clipped Gaussian, or the fixed S1/M1/L1 sizes.
    bn : {"batch", "running"}
        BatchNorm statistics (docs/readings.md#adaptivefl-batchnorm).
    scalefl_exits : tuple of int
        ScaleFL's early-exit layers (empty = the model's default).
    scalefl_kd : float
        ScaleFL's self-distillation weight after 25% of the rounds.
    """

    variant: Variant = key("method", VARIANTS["adaptivefl"], parse=lambda name: VARIANTS[name])
    selection: str = key("adaptivefl-selection", "rl", "AdaptiveFL: client selection (rl = curiosity x resource; ablations +C, +S, +Random)", choices=SELECTION, methods=("adaptivefl",))
    dispatch: str = key("adaptivefl-dispatch", "random", "AdaptiveFL: model per slot: random pool member, or always the largest (+Greed)", choices=("random", "largest"), methods=("adaptivefl",))
    ratios: tuple[float, ...] = key("adaptivefl-ratios", "0.66,0.40", "AdaptiveFL pool: width ratios r_w of the M and S levels (all variants: it sets the tiers' capacities)", parse=floats())
    starts: tuple[int, ...] = key("adaptivefl-starts", "", "AdaptiveFL pool: start layers I_1 > .. > I_p ('' = model default; one value = coarse-grained)", parse=ints())
    tau: int = key("adaptivefl-tau", 1, "AdaptiveFL pool: shallow-layer threshold tau (I >= tau)", min=0)
    tier_proportions: tuple[float, ...] = key("adaptivefl-tier-proportions", "4:3:3", "AdaptiveFL and its baselines: weak:medium:strong device tiers (simulation)", parse=floats(":"))
    round_budget_s: float = key("adaptivefl-round-budget-s", 0.0, "AdaptiveFL and its baselines: a device that measured itself (measure-devices) and declares no capacity may train the largest submodel whose predicted local training time per round fits this many seconds, re-predicted every round from its last round's speed (0 = off; deployment: timing decides)", min=0.0)
    tier_capacity: str = key("adaptivefl-tier-capacity", "gaussian", "AdaptiveFL and its baselines: a tier's capacity per request: the authors' clipped Gaussian (uncertain environments), or fixed S1/M1/L1 sizes", choices=("gaussian", "fixed"))
    bn: str = key("adaptivefl-bn", "batch", "AdaptiveFL and its baselines: BatchNorm with batch statistics (authors: track_running_stats=False) or running statistics aggregated by Alg. 2", choices=("batch", "running"))
    scalefl_exits: tuple[int, ...] = key("scalefl-exits", "", "ScaleFL: hidden layers followed by an early exit ('' = model default: VGG16 '8,10', CNN '2,3')", parse=ints(), methods=("scalefl",))
    scalefl_kd: float = key("scalefl-kd", 0.0, "ScaleFL: self-distillation weight from the deepest exit after 25% of the rounds (authors' comparison: 0)", min=0.0, methods=("scalefl",))


KEYS = keys_of(dict.fromkeys(NAMES, AdaptiveFLParams))
