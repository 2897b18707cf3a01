"""Does the forgetting hold? 4-bit/8-bit reloads (:mod:`.quantize`), the relearning attack (:mod:`.relearn`), the
audit that runs them with the membership attacks (:mod:`.audit`), and UNDO, the distillation after unlearning meant to
make the forgetting hold (:mod:`.distill`)."""

from .audit import (
    PRIMARY_ATTACK,
    audit_markdown,
    audit_record_fields,
    membership_check,
    quantization_verdict,
    run_audit,
)
from .distill import distill_into_perturbed, perturb_toward_noise
from .quantize import (
    CPU_PACKING_IN_MULTIPLE,
    CPU_PACKING_OUT_MULTIPLE,
    CPU_PACKING_REASON,
    MIN_QUANTIZED_SHARE,
    QUANTIZATION_MODES,
    RETURN_THRESHOLD,
    check_quantization_robustness,
    keep_4bit_layers_trainable,
    linear_layers,
    mode_measured,
    modules_to_keep_for_cpu,
    quantization_config,
    quantization_table,
    repacks_4bit_on_this_cpu,
    save_for_quantization,
)
from .relearn import (
    RELEARN_PROBABILITY_THRESHOLD,
    RELEARN_THRESHOLD,
    check_relearning_robustness,
    relearning_curve,
    relearning_table,
    split_for_relearning,
)

__all__ = [
    "CPU_PACKING_IN_MULTIPLE",
    "CPU_PACKING_OUT_MULTIPLE",
    "CPU_PACKING_REASON",
    "MIN_QUANTIZED_SHARE",
    "PRIMARY_ATTACK",
    "QUANTIZATION_MODES",
    "RELEARN_PROBABILITY_THRESHOLD",
    "RELEARN_THRESHOLD",
    "RETURN_THRESHOLD",
    "audit_markdown",
    "audit_record_fields",
    "check_quantization_robustness",
    "check_relearning_robustness",
    "distill_into_perturbed",
    "keep_4bit_layers_trainable",
    "linear_layers",
    "membership_check",
    "mode_measured",
    "modules_to_keep_for_cpu",
    "perturb_toward_noise",
    "quantization_config",
    "quantization_table",
    "quantization_verdict",
    "relearning_curve",
    "relearning_table",
    "repacks_4bit_on_this_cpu",
    "run_audit",
    "save_for_quantization",
    "split_for_relearning",
]
