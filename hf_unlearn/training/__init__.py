"""Training: :class:`UnlearnConfig`, :class:`UnlearnTrainer` (glue over Trainer) and what it composes: the frozen
reference (:mod:`.reference`), the objective-state and progress callbacks (:mod:`.callbacks`; MASC's probes and stop
are :mod:`hf_unlearn.objectives.masc`'s, re-exported here), the loss logs (:mod:`.loss_tracking`), output folders
(:mod:`.output_dir`), memory accounting (:mod:`.memory`), and the typed run record (:mod:`.record`, built by
:mod:`.record_builder`) with its request ledger (:mod:`.ledger`)."""

from ..objectives.masc.options import MASC_THRESHOLDS, STOP_PROBES, STOP_TARGETS, resolved_for_data
from ..objectives.masc.probe import ProbeSets, ProbeState, has_dropout
from ..objectives.masc.stopping import STOPPING_TARGETS, Probe, ViolationStoppingCallback
from .adapters import is_peft_model
from .callbacks import (
    ObjectiveStateCallback,
    QuietProgressCallback,
    RetainPairingCallback,
    StageProgressCallback,
    report_progress_in,
)
from .choices import DEFAULT_REFUSALS, FORGET_SCORINGS, sharded_surgery_error
from .config import UnlearnConfig
from .ledger import (
    LEDGER_FILE,
    forget_set_fingerprint,
    full_ledger,
    ledger_entry,
    ledger_markdown,
    load_ledger,
    loaded_from,
    save_ledger,
)
from .loss_tracking import (
    LossTracker,
)
from .memory import (
    DTYPE_BYTES,
    NF4_BYTES,
    StateBytes,
    StateBytesCallback,
    lora_parameter_count,
    measured_state_bytes,
    parameter_counts,
    predicted_state_bytes,
)
from .output_dir import (
    CHECKPOINT_PATTERN,
    MODEL_FILES,
    check_writable,
    prepare_output_dir,
    previous_run,
    resolve_resume,
)
from .record import (
    RECORD_FILE,
    UnlearnRecord,
    dataset_description,
)
from .record_builder import (
    CONTINUATION_HYPERPARAMETERS,
    GUARD_HYPERPARAMETERS,
    STOPPING_HYPERPARAMETERS,
    TRAINING_HYPERPARAMETERS,
    build_record,
    hyperparameters,
    papers,
    stop_kind,
    stop_reason,
    surgery_history,
)
from .reference import (
    ZERO3_COPY,
    adapters_disabled,
    deepspeed_reference,
    frozen_copy,
    make_reference,
    prepare_reference,
    zero3_copy,
    zero3_partitioned,
    zero_stage,
)
from .trainer import (
    PARTS,
    UnlearnTrainer,
)

__all__ = [
    "CHECKPOINT_PATTERN",
    "CONTINUATION_HYPERPARAMETERS",
    "DEFAULT_REFUSALS",
    "DTYPE_BYTES",
    "FORGET_SCORINGS",
    "GUARD_HYPERPARAMETERS",
    "LEDGER_FILE",
    "LossTracker",
    "MASC_THRESHOLDS",
    "MODEL_FILES",
    "NF4_BYTES",
    "ObjectiveStateCallback",
    "PARTS",
    "Probe",
    "ProbeSets",
    "ProbeState",
    "QuietProgressCallback",
    "RECORD_FILE",
    "RetainPairingCallback",
    "STOPPING_HYPERPARAMETERS",
    "STOP_PROBES",
    "STOPPING_TARGETS",
    "STOP_TARGETS",
    "StageProgressCallback",
    "StateBytes",
    "StateBytesCallback",
    "TRAINING_HYPERPARAMETERS",
    "UnlearnConfig",
    "UnlearnRecord",
    "UnlearnTrainer",
    "ViolationStoppingCallback",
    "ZERO3_COPY",
    "adapters_disabled",
    "build_record",
    "check_writable",
    "dataset_description",
    "deepspeed_reference",
    "forget_set_fingerprint",
    "frozen_copy",
    "full_ledger",
    "has_dropout",
    "hyperparameters",
    "is_peft_model",
    "ledger_entry",
    "ledger_markdown",
    "load_ledger",
    "loaded_from",
    "lora_parameter_count",
    "make_reference",
    "measured_state_bytes",
    "papers",
    "parameter_counts",
    "predicted_state_bytes",
    "prepare_output_dir",
    "prepare_reference",
    "previous_run",
    "report_progress_in",
    "resolve_resume",
    "resolved_for_data",
    "save_ledger",
    "sharded_surgery_error",
    "stop_kind",
    "stop_reason",
    "surgery_history",
    "zero3_copy",
    "zero3_partitioned",
    "zero_stage",
]
