"""Run-config keys of SHEFL (and Fed-Ensemble, a SHEFL preset)."""

from hetfl.common.config import ConfigError, Key
from hetfl.common.nodeconfig import NodeKey, choice, quoted

from .core import COEFFICIENTS

DEVICE_CLASSES = ("hpc", "lpc")  # high- and low-performance clients
NODE_KEYS = (
    NodeKey("device-class", "SHEFL: this device's class (a real device declares it; simulation draws it from "
            "hpc-fraction)", f"one of {quoted(DEVICE_CLASSES)}", choice(*DEVICE_CLASSES)),
)


def check(cfg: dict) -> None:
    """SHEFL needs HPCs when it samples HPC clusters; a role's local work is given in steps or in epochs, not both."""
    if cfg["method"] == "shefl" and cfg["hpc-per-round"] > 0 and cfg["hpc-fraction"] == 0.0:
        raise ConfigError(
            "run-config key 'hpc-per-round' = %d needs HPCs, but 'hpc-fraction' = 0.0; "
            "set hpc-fraction in (0, 1] or hpc-per-round = 0" % cfg["hpc-per-round"]
        )
    if cfg["method"] == "shefl" and cfg["hpc-models"] == "one" and cfg["hpc-per-round"] > 0:
        raise ConfigError(f"run-config key 'hpc-models' = 'one' samples every device as a one-model client; "
                          f"'hpc-per-round' = {cfg['hpc-per-round']} must be 0")
    for role in ("hpc", "lpc"):
        if cfg[f"{role}-local-steps"] and cfg[f"{role}-local-epochs"]:
            raise ConfigError(f"run-config keys '{role}-local-steps' = {cfg[f'{role}-local-steps']} and "
                              f"'{role}-local-epochs' = {cfg[f'{role}-local-epochs']}: set one of them (the other 0)")


def role_work(cfg: dict, role: str) -> tuple[int | None, int | None]:
    """(steps, epochs) for local_train of a client in `role` (straggler study, Fig. 7): the role's own local
    epochs or steps when set, else the run's local-steps / local-epochs (None, None)."""
    if cfg[f"{role}-local-epochs"]:
        return 0, cfg[f"{role}-local-epochs"]
    if cfg[f"{role}-local-steps"]:
        return cfg[f"{role}-local-steps"], None
    return None, None


def client_work(cfg: dict, hpc: bool) -> tuple[int, int] | None:
    """(local epochs, models trained) of one client in a round: its role's epochs (`role_work`) or the run's
    local-epochs; SHEFL HPCs train all M models, a restricted Fed-Ensemble HPC (hpc-models = "one") and every other
    client one (straggler study, Fig. 7). None for step-based local work."""
    steps, epochs = role_work(cfg, "hpc" if hpc else "lpc")
    if not epochs:
        if steps or cfg["local-steps"]:
            return None
        epochs = cfg["local-epochs"]
    return epochs, (cfg["shefl-models"] if hpc and cfg["hpc-models"] == "all" else 1)


KEYS = (
    Key("shefl-models", int, 5, "SHEFL: ensemble size M", min=1, max=64),
    Key("hpc-fraction", float, 0.5, "SHEFL: fraction of all clients that are high-power (simulation)", min=0.0, max=1.0),
    Key("hpc-per-round", int, 5, "SHEFL: HPC clusters C_h (HPCs sampled per round)", min=0),
    Key("topk-density", float, 0.1, "SHEFL: LPC top-k density k (fraction of d); 1.0 = dense", min=0.0, max=1.0, min_inclusive=False),
    Key("resource-ratio", float, 5.0, "SHEFL: HPC:LPC budget r; HPC density per model = min(1, k r / M)", min=0.0, min_inclusive=False),
    Key("topk-scope", str, "global", "SHEFL: top-k over the whole model or per tensor", choices=("global", "tensor")),
    Key("error-feedback", bool, False, "SHEFL: keep the top-k residual on the client (Stich et al.)"),
    Key("coefficients", str, "balanced", "SHEFL: aggregation weights (Eq. 2 variants)", choices=COEFFICIENTS),
    Key("lpc-local-steps", int, 0, "SHEFL: local steps of LPCs (0 = local-steps; straggler study)", min=0),
    Key("hpc-local-steps", int, 0, "SHEFL: local steps of HPCs (0 = local-steps)", min=0),
    Key("hpc-models", str, "all", "SHEFL: HPCs train all M models (SHEFL), or every device one model with its device's work (restricted Fed-Ensemble, Fig. 7)", choices=("all", "one")),
    Key("lpc-local-epochs", int, 0, "SHEFL: local epochs of LPCs (0 = the run's local work; straggler study: 1)", min=0),
    Key("hpc-local-epochs", int, 0, "SHEFL: local epochs of HPCs (0 = the run's local work; straggler study: 10)", min=0),
)
