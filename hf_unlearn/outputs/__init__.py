"""What a run writes from its record: the report (:mod:`.report`), the model card from its template
(:mod:`.model_card`), plots (:mod:`.plots`) and the Hub push (:mod:`.hub`)."""

from .card_metadata import is_hub_id
from .hub import (
    ensure_hub_reachable,
    push_folder,
)
from .model_card import (
    TEMPLATE_PATH,
    build_model_card,
    write_model_card,
)
from .plots import (
    RADAR_AXES,
    plot_radar,
    plot_sustainability,
    plot_truth_ratio_histogram,
    radar_values,
)
from .report import (
    METRICS,
    evaluation_markdown,
    forget_quality_line,
    forget_quality_sentence,
    format_value,
    plot_history,
    report_markdown,
    report_table,
    stop_sentence,
    write_report,
)

__all__ = [
    "METRICS",
    "RADAR_AXES",
    "TEMPLATE_PATH",
    "build_model_card",
    "ensure_hub_reachable",
    "evaluation_markdown",
    "forget_quality_line",
    "forget_quality_sentence",
    "format_value",
    "is_hub_id",
    "plot_history",
    "plot_radar",
    "plot_sustainability",
    "plot_truth_ratio_histogram",
    "push_folder",
    "radar_values",
    "report_markdown",
    "report_table",
    "stop_sentence",
    "write_model_card",
    "write_report",
]
