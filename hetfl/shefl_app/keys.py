"""Run-config keys and parameters of SHEFL (and Fed-Ensemble, a SHEFL preset)."""

from dataclasses import dataclass

from hetfl.common.config import COMMON, ConfigError, keys_of
from hetfl.common.nodeconfig import NodeKey, choice, quoted
from hetfl.common.params import MethodParams, key

from .core import COEFFICIENTS

DEVICE_CLASSES = ("hpc", "lpc")  # high- and low-performance clients
DEVICE_CLASS = NodeKey("device-class", "SHEFL: this device's class (a real device declares it; simulation draws it from "
                       "shefl-hpc-fraction)", f"one of {quoted(DEVICE_CLASSES)}", choice(*DEVICE_CLASSES))
NODE_KEYS = (DEVICE_CLASS,)


def check(cfg: dict) -> None:
    """SHEFL needs HPCs when it samples HPC clusters; a role's local work is given in steps or in epochs, not both."""
    if cfg["method"] == "shefl" and cfg["shefl-hpc-per-round"] > 0 and cfg["shefl-hpc-fraction"] == 0.0:
        raise ConfigError(
            "run-config key 'shefl-hpc-per-round' = %d needs HPCs, but 'shefl-hpc-fraction' = 0.0; "
            "set shefl-hpc-fraction in (0, 1] or shefl-hpc-per-round = 0" % cfg["shefl-hpc-per-round"]
        )
    if cfg["method"] == "shefl" and cfg["shefl-hpc-models"] == "one" and cfg["shefl-hpc-per-round"] > 0:
        raise ConfigError(f"run-config key 'shefl-hpc-models' = 'one' samples every device as a one-model client; "
                          f"'shefl-hpc-per-round' = {cfg['shefl-hpc-per-round']} must be 0")
    for role in ("hpc", "lpc"):
        steps, epochs = f"shefl-{role}-local-steps", f"shefl-{role}-local-epochs"
        if cfg[steps] and cfg[epochs]:
            raise ConfigError(f"run-config keys '{steps}' = {cfg[steps]} and '{epochs}' = {cfg[epochs]}: set one of them "
                              "(the other 0)")


def role_work(cfg: dict, role: str) -> tuple[int | None, int | None]:
    """(steps, epochs) for local_train of a client in `role` (:meth:`SHEFLParams.role_work`)."""
    return SHEFLParams.from_config(cfg).role_work(role)


def client_work(cfg: dict, hpc: bool) -> tuple[int, int] | None:
    """(local epochs, models trained) of one client in a round: its role's epochs (`role_work`) or the run's
    local-epochs; SHEFL HPCs train all M models, a restricted Fed-Ensemble HPC (shefl-hpc-models = "one") and every
    other client one (straggler study, Fig. 7). None for step-based local work."""
    defaults = {**COMMON.defaults(), **{k.name: k.default for k in KEYS}}
    p = SHEFLParams.from_config({**{k: defaults[k] for k in SHEFLParams.config_keys()}, **cfg})  # stored configs
    steps, epochs = p.role_work("hpc" if hpc else "lpc")
    if not epochs:
        if steps or cfg["local-steps"]:
            return None
        epochs = cfg["local-epochs"]
    return epochs, (p.num_models if hpc and p.hpc_models == "all" else 1)


@dataclass(frozen=True)
class SHEFLParams(MethodParams):
    """SHEFL's parameters (Algorithm 1; docs/readings.md#shefl).

    Parameters
    ----------
    num_models : int
        Ensemble size M.
    hpc_fraction : float
        Share of simulated clients that are high-power (a real device declares its class instead, or is ranked by
        its measured speed: :func:`~hetfl.shefl_app.core.measured_classes`).
    hpc_speed : float
        Measured devices: an HPC at this many training samples/s or more; 0 = the fastest `hpc_fraction` of them.
    hpc_per_round : int
        HPC clusters C_h: HPCs sampled per round; the other sampled clients are LPCs.
    topk_density : float
        LPC top-k density k (fraction of the model's d entries); 1.0 = dense.
    resource_ratio : float
        HPC:LPC budget r; the HPC density per model is min(1, k r / M).
    topk_scope : {"global", "tensor"}
        Top-k over the whole flattened model or per tensor.
    error_feedback : bool
        Keep the top-k residual on the client and add it to the next delta (Stich et al. 2018).
    coefficients : str
        Aggregation weights of Eq. 2 (``core.COEFFICIENTS``).
    hpc_models : {"all", "one"}
        HPCs train all M models (SHEFL) or one like every device (restricted Fed-Ensemble, Fig. 7).
    hpc_local_steps, lpc_local_steps, hpc_local_epochs, lpc_local_epochs : int
        A role's own local work (0 = the run's local-steps / local-epochs; straggler study).
    """

    num_models: int = key("shefl-models", 5, "SHEFL: ensemble size M", min=1, max=64)
    hpc_fraction: float = key("shefl-hpc-fraction", 0.5, "SHEFL: fraction of all clients that are high-power (simulation)", min=0.0, max=1.0)
    hpc_speed: float = key("shefl-hpc-speed", 0.0, "SHEFL: a device that measured itself (measure-devices) and declares no class is an HPC at this many training samples/s or more; 0 = the fastest shefl-hpc-fraction of such devices are", min=0.0)
    hpc_per_round: int = key("shefl-hpc-per-round", 5, "SHEFL: HPC clusters C_h (HPCs sampled per round)", min=0)
    topk_density: float = key("shefl-topk-density", 0.1, "SHEFL: LPC top-k density k (fraction of d); 1.0 = dense", min=0.0, max=1.0, min_inclusive=False)
    resource_ratio: float = key("shefl-resource-ratio", 5.0, "SHEFL: HPC:LPC budget r; HPC density per model = min(1, k r / M)", min=0.0, min_inclusive=False)
    topk_scope: str = key("shefl-topk-scope", "global", "SHEFL: top-k over the whole model or per tensor", choices=("global", "tensor"))
    error_feedback: bool = key("shefl-error-feedback", False, "SHEFL: keep the top-k residual on the client (Stich et al.)")
    coefficients: str = key("shefl-coefficients", "balanced", "SHEFL: aggregation weights (Eq. 2 variants)", choices=COEFFICIENTS)
    hpc_models: str = key("shefl-hpc-models", "all", "SHEFL: HPCs train all M models (SHEFL), or every device one model with its device's work (restricted Fed-Ensemble, Fig. 7)", choices=("all", "one"))
    hpc_local_steps: int = key("shefl-hpc-local-steps", 0, "SHEFL: local steps of HPCs (0 = local-steps)", min=0)
    lpc_local_steps: int = key("shefl-lpc-local-steps", 0, "SHEFL: local steps of LPCs (0 = local-steps; straggler study)", min=0)
    hpc_local_epochs: int = key("shefl-hpc-local-epochs", 0, "SHEFL: local epochs of HPCs (0 = the run's local work; straggler study: 10)", min=0)
    lpc_local_epochs: int = key("shefl-lpc-local-epochs", 0, "SHEFL: local epochs of LPCs (0 = the run's local work; straggler study: 1)", min=0)

    def role_work(self, role: str) -> tuple[int | None, int | None]:
        """(steps, epochs) for local_train of a client in `role` ("hpc" | "lpc"): the role's own local epochs or
        steps when set, else (None, None) = the run's local-steps / local-epochs (straggler study, Fig. 7)."""
        epochs, steps = getattr(self, f"{role}_local_epochs"), getattr(self, f"{role}_local_steps")
        if epochs:
            return 0, epochs
        if steps:
            return steps, None
        return None, None


KEYS = keys_of({"shefl": SHEFLParams})

RENAMED = {old: f"shefl-{old}" for old in (
    "hpc-fraction", "hpc-per-round", "topk-density", "resource-ratio", "topk-scope", "error-feedback", "coefficients",
    "lpc-local-steps", "hpc-local-steps", "hpc-models", "lpc-local-epochs", "hpc-local-epochs")}
