"""What an unlearning run writes: its record (:mod:`~hf_unlearn.training.record_builder`), saved with every
checkpoint and final save beside the model, the model card written from it, and the Hub push that checks the Hub
is reachable first. A mixin of :class:`~hf_unlearn.training.trainer.UnlearnTrainer` (before ``Trainer`` in its bases,
so that these overrides call Trainer's own through ``super()``)."""

from __future__ import annotations

from typing import Any

from .adapters import is_peft_model
from .record import UnlearnRecord
from .record_builder import build_record


class RunOutputs:
    """The record, the model card and the Hub push of an :class:`~hf_unlearn.training.trainer.UnlearnTrainer`."""

    def _make_record(self, final: bool) -> UnlearnRecord:
        """The run record (:func:`~hf_unlearn.training.record_builder.build_record`) of the trainer's state now.
        ``final`` (once, at the end of ``train()``, on every process) adds the exact-reproduction bound, which needs
        forward passes; the record saved with a checkpoint is built without running the model."""
        model = self.accelerator.unwrap_model(self.model)
        adapter = None
        if is_peft_model(model):
            adapter = str(model.peft_config[model.active_adapter].peft_type.value).lower()
            model = model.get_base_model()
        return build_record(
            self.args,
            self._objectives(),
            self.state,
            self.stopping_callback,
            model,
            adapter,
            self._datasets,
            probe_seconds=self.probes.seconds,
            probe_seconds_by_set=self.probes.seconds_by_set,
            restored_step=self.probes.restored_step,
            wall_seconds=self._train_seconds,
            forget_fingerprint=self.forget_fingerprint,
            earlier_requests=self.earlier_requests,
            objective_state=self.objective_state_callback.state()["attributes"]["states"],
            exact_reproduction_bound=self.exact_reproduction_bound() if final else None,
            previous=getattr(self, "record", None),
        )

    def _write_record_and_card(self, output_dir: str) -> None:
        from ..outputs.model_card import write_run_outputs

        record = self.record if self.record.complete else self._make_record(final=False)
        model = self.accelerator.unwrap_model(self.model)
        write_run_outputs(record, output_dir, self.args.hub_model_id, model if is_peft_model(model) else None)

    def create_model_card(self, model_name: str | None = None, tags: Any = None, **kwargs: Any) -> None:
        """Write README.md (the unlearning model card, from the run record) into ``output_dir``; replaces
        Trainer's generic draft."""
        if not self.is_world_process_zero():
            return
        if model_name or tags:
            extra = dict(self.record.extra)
            if model_name:
                extra["model_name"] = model_name
            if tags:
                extra["tags"] = sorted(set([tags] if isinstance(tags, str) else tags))
            self.record.update(extra=extra)
        self._write_record_and_card(self.args.output_dir)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as Trainer does, plus ``unlearn_record.json`` and the model card it writes, so every checkpoint
        and final save says what was done. Nothing is measured here: the record is read, not recomputed. Under
        ``push_to_hub`` a save the user asks for pushes as Trainer's does, but after the record and card are
        written, so a push the record refuses (:meth:`push_to_hub`) leaves a complete saved run."""
        super().save_model(output_dir, _internal_call=True)
        if self.args.should_save:
            self._write_record_and_card(output_dir or self.args.output_dir)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def push_to_hub(self, *args: Any, **kwargs: Any) -> Any:
        """Push as Trainer does, but first read the run's record as ``hf-unlearn push`` does: a run it does not say
        forgot the forget set is refused unless ``push_unverified`` (its card then says what the record said); then
        make sure the Hub is reachable. Either failure comes before Trainer's push saves or uploads anything."""
        from accelerate.utils import broadcast_object_list

        from ..outputs.hub import ensure_hub_reachable, mark_pushed_unverified, record_unverified_reasons

        # The first process's record decides for all (it alone holds an audit run after training), so that every
        # process refuses or goes on together: Trainer's push saves on all of them before the first one uploads.
        first = self.is_world_process_zero()
        decided = [record_unverified_reasons(self.record, self.args.output_dir) if first else []]
        if self.args.world_size > 1:
            broadcast_object_list(decided)
        reasons = decided[0]
        if reasons and not self.args.push_unverified:
            raise ValueError(
                "UnlearnTrainer.push_to_hub: not pushed, because the run's own record does not say the forget set "
                f"was forgotten: {'; '.join(reasons)}. Judge the saved run (`hf-unlearn audit`, then `hf-unlearn "
                "push`), or set push_unverified=True in UnlearnConfig to publish it anyway (its card then says so). "
                "Nothing was uploaded."
            )
        ensure_hub_reachable(self.args.output_dir)
        mark_pushed_unverified(self.record, reasons)
        return super().push_to_hub(*args, **kwargs)


__all__ = ["RunOutputs"]
