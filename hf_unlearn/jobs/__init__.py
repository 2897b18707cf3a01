"""What the ``hf-unlearn`` commands run: loading and building (:mod:`.models`), unlearning with a report
(:mod:`.unlearn`), the demo on the embedded benchmarks (:mod:`.demo`), the checks of a saved model (:mod:`.checks`),
sequential requests (:mod:`.sequence`) and the side-by-side comparison of methods (:mod:`.compare`, on the settings
of :mod:`.compare_setups`, written out by :mod:`.compare_report`)."""

from .checks import run_audit_job, run_eval_job, run_quant_check_job, run_relearn_check_job
from .compare import build_region, in_region, measure_for_region, parse_overrides, region_misses
from .compare_report import compare_table, write_compare
from .compare_setups import run_compare, tofu_setting
from .demo import membership_after, run_demo
from .models import build_trainer, earlier_requests_of, load_model_and_tokenizer
from .sequence import ForgetRequest, SequenceResult, run_sequence_job, unlearn_sequentially
from .unlearn import run_unlearning_job, unlearn_and_report

__all__ = [
    "ForgetRequest",
    "SequenceResult",
    "build_region",
    "build_trainer",
    "compare_table",
    "earlier_requests_of",
    "in_region",
    "load_model_and_tokenizer",
    "measure_for_region",
    "membership_after",
    "parse_overrides",
    "region_misses",
    "run_audit_job",
    "run_compare",
    "run_demo",
    "run_eval_job",
    "run_quant_check_job",
    "run_relearn_check_job",
    "run_sequence_job",
    "run_unlearning_job",
    "tofu_setting",
    "unlearn_and_report",
    "unlearn_sequentially",
    "write_compare",
]
