"""Run-config keys of AdaptiveFL and its baselines (HeteroFL, All-Large, Decoupled are variants)."""

from hetfl.common.config import ConfigError, Key
from hetfl.common.models import MODELS, PRUNABLE
from hetfl.common.nodeconfig import NodeKey, is_positive_number, quoted

VARIANTS = ("adaptivefl", "heterofl", "all-large", "decoupled", "scalefl")
SELECTION = ("rl", "curiosity", "resource", "random")
KNOWN_TIERS = ("heterofl", "decoupled", "scalefl")  # baselines that are told each device's tier
TIERS = ("weak", "medium", "strong")  # device tiers (Sec. 4.1), smallest first
NODE_KEYS = (
    NodeKey("capacity", "AdaptiveFL: this device's tier or its budget in model parameters (a real device declares "
            "it; simulation draws the tier from device-proportions)",
            f"one of {quoted(TIERS)} or a number of parameters > 0",
            lambda v: (isinstance(v, str) and v in TIERS) or is_positive_number(v)),
)


def parse_floats(cfg: dict, key: str, sep: str = ",") -> tuple[float, ...]:
    """A run-config list such as '0.66,0.40' or '4:3:3' as floats, with an error naming the key."""
    text = str(cfg[key]).strip()
    if not text:
        return ()
    try:
        return tuple(float(v) for v in text.split(sep))
    except ValueError:
        raise ConfigError(f"run-config key '{key}' = {cfg[key]!r}: expected numbers separated by '{sep}'") from None


def check(cfg: dict) -> None:
    """AdaptiveFL's whole-config checks (ratios, start layers, device proportions, a prunable model)."""
    if cfg["method"] != "adaptivefl":
        return
    ratios = parse_floats(cfg, "adaptivefl-ratios")
    if len(ratios) != 2 or not 1.0 > ratios[0] > ratios[1] > 0.0:
        raise ConfigError(f"run-config key 'adaptivefl-ratios' = {cfg['adaptivefl-ratios']!r}: expected 'r_M,r_S' "
                          "with 1 > r_M > r_S > 0 (paper: '0.66,0.40')")
    starts = parse_floats(cfg, "adaptivefl-starts")
    if any(s != int(s) or s < 0 for s in starts):
        raise ConfigError(f"run-config key 'adaptivefl-starts' = {cfg['adaptivefl-starts']!r}: expected "
                          "non-negative layer indices such as '8,6,4' ('' = the model's default)")
    props = parse_floats(cfg, "device-proportions", ":")
    if len(props) != 3 or min(props) < 0 or sum(props) <= 0:
        raise ConfigError(f"run-config key 'device-proportions' = {cfg['device-proportions']!r}: expected "
                          "'weak:medium:strong' with non-negative numbers, e.g. '4:3:3'")
    if cfg["adaptivefl-variant"] == "scalefl":
        from .scalefl import DEFAULT_EXITS

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


KEYS = (
    Key("adaptivefl-variant", str, "adaptivefl", "AdaptiveFL or a baseline built from the same code", choices=VARIANTS),
    Key("adaptivefl-selection", str, "rl", "AdaptiveFL: client selection (rl = curiosity x resource; ablations +C, +S, +Random)", choices=SELECTION),
    Key("adaptivefl-dispatch", str, "random", "AdaptiveFL: model per slot: random pool member, or always the largest (+Greed)", choices=("random", "largest")),
    Key("adaptivefl-ratios", str, "0.66,0.40", "AdaptiveFL: width ratios r_w of the M and S levels"),
    Key("adaptivefl-starts", str, "", "AdaptiveFL: start layers I_1 > .. > I_p ('' = model default; one value = coarse-grained)"),
    Key("adaptivefl-tau", int, 1, "AdaptiveFL: shallow-layer threshold tau (I >= tau)", min=0),
    Key("device-proportions", str, "4:3:3", "AdaptiveFL: weak:medium:strong devices (simulation)"),
    Key("device-capacity", str, "gaussian", "AdaptiveFL: device capacity per request: the authors' clipped Gaussian per tier (uncertain environments), or fixed S1/M1/L1 sizes", choices=("gaussian", "fixed")),
    Key("scalefl-exits", str, "", "ScaleFL baseline: hidden layers followed by an early exit ('' = model default: VGG16 '8,10', CNN '2,3')"),
    Key("scalefl-kd", float, 0.0, "ScaleFL baseline: self-distillation weight from the deepest exit after 25% of the rounds (authors' comparison: 0)", min=0.0),
    Key("adaptivefl-bn", str, "batch", "AdaptiveFL and its baselines: BatchNorm with batch statistics (authors: track_running_stats=False) or running statistics aggregated by Alg. 2", choices=("batch", "running")),
)
