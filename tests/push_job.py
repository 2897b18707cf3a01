"""The trainer's Hub push on two processes: `torchrun --nproc_per_node 2 tests/push_job.py OUT`. Only the first
process's record holds a membership verdict (as after an audit, which runs there alone); each rank pushes offline and
writes which error stopped it, so the test can see that every rank followed the first one's record."""

import json
import os
import sys

from conftest import forget_set, make_tiny_model, retain_set

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.cli.main import end_process_group
from hf_unlearn.evaluation.membership import membership_verdict


def push_error(trainer) -> str:
    try:
        trainer.push_to_hub()
    except (ValueError, ConnectionError) as error:
        return type(error).__name__
    return "pushed"


def main(out: str) -> None:
    config = UnlearnConfig(
        output_dir=os.path.join(out, "run"), max_steps=2, report_to="none", save_strategy="no", use_cpu=True,
        disable_tqdm=True, probe_interval=1,
    )  # fmt: skip
    trainer = UnlearnTrainer(make_tiny_model(), config, forget_set(), retain_set())
    trainer.train()
    rank = trainer.args.process_index
    unjudged = push_error(trainer)
    if trainer.is_world_process_zero():
        landed = membership_verdict({"loss": 0.42}, {"loss": 0.40}, off_intervals={"loss": (-0.02, 0.06)})
        trainer.record.update(evaluation={"membership": {"auc": {"loss": 0.42}, "membership": landed}})
    judged = push_error(trainer)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"unjudged": unjudged, "judged_on_first": judged}, f)
    end_process_group(finished=True)


if __name__ == "__main__":
    main(sys.argv[1])
