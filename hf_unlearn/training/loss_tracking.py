"""The forget and retain losses as Trainer logs them, kept on the device between logs (no host read per step), and
the check that stops a run before an update built on a NaN or infinite loss."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch


class LossTracker:
    """Per-part loss sums since Trainer's last log, and per part whether a loss of the current optimizer step's
    window was non-finite (with the first such value)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.nonfinite: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def track(self, part: str, loss: torch.Tensor) -> None:
        """Add the part's (detached) loss and remember whether it is finite, on the device."""
        self.sums[part] = self.sums.get(part, torch.zeros((), device=loss.device)) + loss.float()
        bad = ~torch.isfinite(loss)
        if part in self.nonfinite:
            seen, first = self.nonfinite[part]
            self.nonfinite[part] = (seen | bad, torch.where(seen, first, loss.float()))
        else:
            self.nonfinite[part] = (bad, loss.float())

    def end_of_step(self, objective_names: Mapping[str, str], next_step: int) -> None:
        """Before the optimizer step: a NaN/inf loss anywhere in the window stops the run (one host read per step)."""
        self.steps += 1
        if not self.nonfinite:
            return
        flags = {part: seen for part, (seen, _) in self.nonfinite.items()}
        if bool(torch.stack(list(flags.values())).any()):
            part = next(p for p, seen in flags.items() if bool(seen))
            value = self.nonfinite[part][1].item()
            raise FloatingPointError(
                f"The {part} loss ({objective_names[part]}) is {value} at step {next_step}; training stopped before "
                "this update, so the last saved checkpoint is intact. Lower the learning rate or check the data."
            )
        self.nonfinite.clear()

    def read_means(self, gather: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        """``{"forget_loss": ..., "retain_loss": ...}``: the mean per optimizer step since the last read (over
        processes with ``gather``), then cleared."""
        steps = max(self.steps, 1)
        means = {f"{part}_loss": gather(total.reshape(1)).mean().item() / steps for part, total in self.sums.items()}
        self.sums.clear()
        self.steps = 0
        return means
