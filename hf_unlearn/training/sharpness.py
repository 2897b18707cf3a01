"""Sharpness-aware unlearning: the forget gradient taken at the worst nearby weights (``sam_rho``).

Fan et al., "Towards LLM Unlearning Resilient to Relearning Attacks: A Sharpness-Aware Minimization Perspective and
Beyond" (Unlearn-Smooth, ICML 2025, arXiv 2502.05374) cast robustness to relearning as a min-max problem on the forget
objective and solve its inner maximisation with one SAM step (Foret et al., ICLR 2021): with ``g`` the forget
objective's gradient at the weights ``w``, the weights are moved to ``w + e`` with ``e = rho * g / ||g||_2`` (one L2
norm over every trainable parameter), the forget gradient is taken *there*, the weights are put back to ``w``, and
that gradient is the one the update uses. The retain gradient is taken at ``w``, as in the reference code's
``SAMTrainer`` (``sam_rho`` 0.1 in its WMDP configurations).

How it sits in :class:`~hf_unlearn.training.trainer.UnlearnTrainer`'s step:

* Two forward/backward passes on the forget batch. The first, at ``w``, is the one the running probe and the
  ``forget_loss`` log see; its gradient only gives the direction of ``e`` and is then dropped. The second, at
  ``w + e``, accumulates into whatever held the forget gradient before (``p.grad``, or gradient surgery's forget
  store), so SAGO / PCGrad combine the sharpness-aware forget gradient with the retain gradient. Trainer's logged
  ``loss`` is the second pass's, as in the reference.
* Gradient accumulation: ``e`` is computed per micro-batch from that micro-batch's own forget gradient (the
  reference computes it per batch). A per-window ``e`` would need the whole window's gradient before any perturbed
  pass, i.e. a third pass over the window's data. Since ``e`` is normalised, the micro-batch's share of the window
  does not change it.
* Under DDP the first pass runs without the all-reduce: each process perturbs its replica by its own gradient (SAM's
  usual "m-sharpness"); the second pass is reduced as any forget pass.
* Only the trainable parameters move (with LoRA: the adapter weights), and they are restored *exactly*, from a copy
  made before the perturbation (``(w + e) - e`` is not ``w`` in floating point). That copy costs one set of trainable
  weights of memory during the step. A zero or non-finite gradient norm (fp16 overflow) means no perturbation.
* Refused under DeepSpeed (ZeRO keeps gradients in its own partitioned buffers, and steps the optimizer inside the
  backward) and FSDP (sharded parameters): the direction ``e`` needs each process to hold its gradients and
  parameters tensor by tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

#: (title, url, authors) of the method, cited in the run record when ``sam_rho`` > 0.
SAM_PAPER = (
    "Towards LLM Unlearning Resilient to Relearning Attacks: A Sharpness-Aware Minimization Perspective and Beyond",
    "https://arxiv.org/abs/2502.05374",
    "Fan, Jia, Zhang, Ramakrishna, Hong, Liu",
)
SAM_RHO_HELP = (
    "Sharpness-aware unlearning (Unlearn-Smooth, arXiv 2502.05374): the forget gradient is taken at the weights "
    "moved by rho * g / ||g|| along the forget gradient g (one more forward/backward on each forget batch), making "
    "the forgetting harder to undo by relearning. 0 (default): off; the paper uses 0.1."
)


def sam_backend_error(backend: str) -> ValueError:
    """The one message for ``sam_rho`` under a backend whose parameters or gradients it cannot reach per tensor."""
    return ValueError(
        f"sam_rho is not available with {backend}: the sharpness-aware step reads each trainable parameter's forget "
        "gradient (p.grad) and moves the parameter itself, which "
        + (
            "DeepSpeed keeps in its own partitioned buffers (and it steps the optimizer inside the backward)"
            if backend == "DeepSpeed"
            else "FSDP shards across processes"
        )
        + ". Use DDP (plain `accelerate launch` or torchrun) or a single process, or sam_rho=0."
    )


def check_sam_config(config: Any) -> None:
    """``UnlearnConfig``'s checks of ``sam_rho``: a non-negative finite number, and no DeepSpeed / FSDP in the
    arguments (a backend chosen by an accelerate config file is checked by the trainer)."""
    rho = config.sam_rho
    if not isinstance(rho, (int, float)) or not 0 <= rho < float("inf"):
        raise ValueError(
            f"sam_rho must be a finite number >= 0 (0: off; the Unlearn-Smooth paper uses 0.1), got {rho!r}."
        )
    if rho and config.deepspeed:
        raise sam_backend_error("DeepSpeed")
    if rho and config.fsdp:
        raise sam_backend_error("FSDP")


def sam_perturbation(grads: Sequence[torch.Tensor | None], rho: float) -> torch.Tensor | None:
    """The scale ``rho / ||g||_2`` of the perturbation ``e = scale * g`` (one norm over all ``grads``; None are left
    out), as a tensor on the gradients' device (no host sync); 0 when the norm is zero or not finite, None without
    any gradient."""
    # At least float32 (a bf16 model's norm would round), float64 for a float64 model.
    present = [
        torch.linalg.vector_norm(g, dtype=torch.promote_types(g.dtype, torch.float32)) for g in grads if g is not None
    ]
    if not present:
        return None
    norm = torch.linalg.vector_norm(torch.stack([n.to(present[0].device, present[0].dtype) for n in present]))
    usable = torch.isfinite(norm) & (norm > 0)
    return torch.where(usable, rho / torch.where(usable, norm, torch.ones_like(norm)), torch.zeros_like(norm))


class ForgetSAM:
    """The sharpness-aware forget step of a trainer; off (a no-op) at ``rho`` = 0.

    Args:
        rho: the perturbation radius (``sam_rho``).
        deepspeed, fsdp: whether the trainer runs under that backend (refused when ``rho`` > 0).
    """

    def __init__(self, rho: float, deepspeed: bool = False, fsdp: bool = False) -> None:
        if rho and deepspeed:
            raise sam_backend_error("DeepSpeed")
        if rho and fsdp:
            raise sam_backend_error("FSDP")
        self.rho = float(rho)
        #: True while the forget pass at the perturbed weights runs: the trainer does not track that pass's loss
        #: or feed its logits to the running probe.
        self.perturbed = False

    @contextmanager
    def perturbed_for(
        self,
        params: Callable[[], Sequence[torch.Tensor]],
        ascent: Callable[[], Any],
        local: Callable[[], AbstractContextManager],
    ) -> Iterator[None]:
        """Around the trainer's forget backward: run ``ascent`` (a forget backward at the current weights, under
        ``local()``, the no-all-reduce context) into empty gradients, move the trainable ``params()`` to the worst
        nearby weights, give the gradients accumulated so far back, and on exit restore the weights exactly. With
        ``rho`` = 0 nothing runs."""
        if not self.rho:
            yield
            return
        params = list(params())
        accumulated = [p.grad for p in params]
        for p in params:
            p.grad = None
        with local():
            ascent()
        scale = sam_perturbation([p.grad for p in params], self.rho)
        saved = []
        with torch.no_grad():
            for p, accumulated_grad in zip(params, accumulated):
                if p.grad is not None and scale is not None:
                    saved.append((p, p.detach().clone()))
                    p.add_(p.grad * scale.to(p.grad.device, p.grad.dtype))
                p.grad = accumulated_grad
        self.perturbed = True
        try:
            yield
        finally:
            self.perturbed = False
            with torch.no_grad():
                for p, weights in saved:
                    p.copy_(weights)


__all__ = ["SAM_PAPER", "SAM_RHO_HELP", "ForgetSAM", "check_sam_config", "sam_backend_error", "sam_perturbation"]
