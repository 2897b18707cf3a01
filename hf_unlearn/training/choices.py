"""The vocabulary of :class:`~hf_unlearn.training.config.UnlearnConfig`: the methods and their objectives, the
weights where a paper departs from 1, the refusals, the allowed values of the string options, and the one error for
gradient surgery under a backend that cannot run it."""

from __future__ import annotations

# method -> (forget objective, retain objective); "none" means no retain term.
METHODS: dict[str, tuple[str, str]] = {
    "masc": ("masc", "kl"),
    "ga": ("ga", "none"),
    "graddiff": ("ga", "nll"),
    "npo": ("npo", "none"),
    "npo_klr": ("npo", "kl"),
    "simnpo": ("simnpo", "nll"),
    "rmu": ("rmu", "rmu_retain"),
    "idk_dpo": ("idk_dpo", "nll"),
    "undial": ("undial", "nll"),
    "wga": ("wga", "nll"),
    "satimp": ("satimp", "nll"),
    "ce_u": ("ce_u", "none"),
    "altpo": ("altpo", "nll"),
    "pdu": ("pdu", "pdu_dual"),
}
# Forget weights (gamma) where a method's paper uses something else than 1: MASC's lambda_forget (TOFU/Qwen
# row of arXiv 2606.02920) and SimNPO's gamma (arXiv 2410.07163).
DEFAULT_FORGET_WEIGHTS = {"masc": 0.1, "simnpo": 0.125}
# Retain weights other than 1: SatImp's reference code adds 0.1 x retain NLL (tmlr-group/SatImp, coeff 0.1; the
# open-unlearning YAML has forget 0.1 and retain 1 instead, its README and Python defaults agree with the paper's).
DEFAULT_RETAIN_WEIGHTS = {"satimp": 0.1}  # keyed, like the forget weights, by the forget objective
DEFAULT_REFUSALS = (
    "I don't know.",
    "I'm not sure about that.",
    "I have no information about that.",
    "That is something I cannot answer.",
)
STOP_PROBES = ("train", "holdout")
FORGET_SCORINGS = ("answer", "continuation")
STOP_TARGETS = ("auto", "alpha", "calibration")
MASC_THRESHOLDS = ("auto", "rho", "calibration")
RETAIN_PROBES = ("screen", "every_probe")
CALIBRATION_REFERENCES = ("start", "current")


def sharded_surgery_error(strategy: str, backend: str) -> ValueError:
    """The one message for gradient surgery under a backend whose gradients it cannot reach tensor by tensor."""
    why = {
        "DeepSpeed": "DeepSpeed ZeRO moves every gradient into its own flat, partitioned buffers during the backward "
        "(param.grad stays empty), so the forget and the retain gradient cannot be kept apart per tensor",
        "FSDP1": "FSDP1 flattens each wrapped module's parameters into one FlatParameter, so per-tensor (per-module) "
        "dot products and norms are not available",
    }[backend]
    return ValueError(
        f"gradient_surgery={strategy!r} is not available with {backend}: {why}. Use FSDP2 (fsdp_config "
        "{'version': 2}, the default of transformers 5; surgery is combined shard by shard there), DDP (plain "
        "`accelerate launch` or torchrun), or gradient_surgery='sum'."
    )


__all__ = [
    "CALIBRATION_REFERENCES",
    "DEFAULT_FORGET_WEIGHTS",
    "DEFAULT_REFUSALS",
    "DEFAULT_RETAIN_WEIGHTS",
    "FORGET_SCORINGS",
    "MASC_THRESHOLDS",
    "METHODS",
    "RETAIN_PROBES",
    "STOP_PROBES",
    "STOP_TARGETS",
    "sharded_surgery_error",
]
