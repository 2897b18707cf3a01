"""Retention-first gradient surgery: combine the forget gradient g_f with the retain gradient g_r.

Pure functions over lists of per-parameter tensors. "Module-wise" means per parameter tensor. Reference:
Xiao et al., "Modeling LLM Unlearning as an Asymmetric Two-Task Learning Problem", ACL 2026, arXiv 2604.14808
(retain is the primary task, forget the auxiliary one; SAGO and module-wise PCGrad); PCGrad after Yu et al.,
"Gradient Surgery for Multi-Task Learning", NeurIPS 2020.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

STRATEGIES = ("sum", "pcgrad", "pcgrad_global", "sago", "sago_prefer_retain", "blur")
EPS = 1e-10


def _conflicts(forget: torch.Tensor, retain: torch.Tensor) -> torch.Tensor:
    """Coordinates where the two gradients point in opposite directions (zeros never conflict)."""
    return torch.sign(forget) * torch.sign(retain) < 0


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Dot product of two same-shape tensors, accumulated in float64 without a float64 copy of fp32 inputs."""
    if a.dtype in (torch.float16, torch.bfloat16):
        a, b = a.float(), b.float()
    return torch.dot(a.reshape(-1), b.reshape(-1)).double()


def _dense(forget: Sequence[torch.Tensor | None], retain: Sequence[torch.Tensor | None]):
    if len(forget) != len(retain):
        raise ValueError(f"Got {len(forget)} forget gradients but {len(retain)} retain gradients.")
    pairs = []
    for f, r in zip(forget, retain):
        if f is None and r is None:
            pairs.append((None, None))
            continue
        reference = f if f is not None else r
        f = torch.zeros_like(reference) if f is None else f
        r = torch.zeros_like(reference) if r is None else r
        if f.shape != r.shape:
            raise ValueError(f"Gradient shapes differ: forget {tuple(f.shape)} vs retain {tuple(r.shape)}.")
        pairs.append((f, r))
    return pairs


def combine_gradients_(
    forget_grads: Sequence[torch.Tensor | None],
    retain_grads: Sequence[torch.Tensor | None],
    strategy: str,
    forget_weight: float = 1.0,
    retain_weight: float = 1.0,
) -> tuple[list[torch.Tensor | None], dict[str, float]]:
    """Combine in place into the retain tensors where they exist; return the update and statistics.

    Formulas (DESIGN §4, after arXiv 2604.14808), with gamma = ``forget_weight``, alpha = ``retain_weight``:

    * ``sum``: ``u = gamma g_f + alpha g_r``.
    * ``pcgrad``: per tensor, if ``<g_f, g_r> < 0`` project g_f off g_r:
      ``g_f' = g_f - <g_f,g_r> / (||g_r||^2 + 1e-10) g_r``; ``u = gamma g_f' + alpha g_r``.
    * ``pcgrad_global``: the same with the dot product and norm over all tensors.
    * ``sago``: elementwise conflict ``c = sign(g_f) sign(g_r) < 0``; ``u = alpha g_r 1[c] + gamma g_f 1[not c]``.
    * ``sago_prefer_retain``: ``u = alpha g_r + gamma g_f 1[not c]``.
    * ``blur`` (forget-priority baseline): ``u = alpha (g_r - <g_r,g_f>/||g_f||^2 g_f) + gamma g_f`` per tensor.

    Statistics: ``cos_forget_retain`` (cos of g_f and g_r), ``cos_update_retain`` (cos of u and g_r, >= 0 for
    the retention-first strategies), and ``conflict_fraction`` (coordinates for sago, tensors for pcgrad).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown gradient surgery {strategy!r}; choose one of {STRATEGIES}.")
    pairs = _dense(forget_grads, retain_grads)
    present = [(f, r) for f, r in pairs if f is not None]
    dot_fr = sum((_dot(f, r) for f, r in present), torch.zeros((), dtype=torch.float64))
    norm_f2 = sum((_dot(f, f) for f, _ in present), torch.zeros((), dtype=torch.float64))
    norm_r2 = sum((_dot(r, r) for _, r in present), torch.zeros((), dtype=torch.float64))
    conflicting = total = 0
    dot_ur = torch.zeros((), dtype=torch.float64)
    norm_u2 = torch.zeros((), dtype=torch.float64)
    updates: list[torch.Tensor | None] = []
    for (f, r), original in zip(pairs, retain_grads):
        if f is None:
            updates.append(None)
            continue
        out = original if original is not None else torch.zeros_like(r)
        if strategy == "sum":
            update = forget_weight * f + retain_weight * r
        elif strategy in ("pcgrad", "pcgrad_global"):
            dot, norm2 = (dot_fr, norm_r2) if strategy == "pcgrad_global" else (_dot(f, r), _dot(r, r))
            projected = f
            if dot < 0:
                projected = f - (dot / (norm2 + EPS)).to(f.dtype) * r
                conflicting += 1
            total += 1
            update = forget_weight * projected + retain_weight * r
        elif strategy == "blur":
            coefficient = (_dot(r, f) / (_dot(f, f) + EPS)).to(f.dtype)
            update = retain_weight * (r - coefficient * f) + forget_weight * f
        else:
            conflict = _conflicts(f, r)
            conflicting += int(conflict.sum())
            total += conflict.numel()
            keep_forget = forget_weight * f.masked_fill(conflict, 0)
            if strategy == "sago":
                update = torch.where(conflict, retain_weight * r, keep_forget)
            else:
                update = retain_weight * r + keep_forget
        dot_ur += _dot(update, r)
        norm_u2 += _dot(update, update)
        out.copy_(update)
        updates.append(out)
    if strategy == "pcgrad_global":
        conflicting, total = int(dot_fr < 0), 1
    stats = {
        "cos_forget_retain": (dot_fr / (norm_f2.sqrt() * norm_r2.sqrt() + EPS)).item(),
        "cos_update_retain": (dot_ur / (norm_u2.sqrt() * norm_r2.sqrt() + EPS)).item(),
        "conflict_fraction": conflicting / total if total else 0.0,
    }
    return updates, stats


def combine_gradients(
    forget_grads: Sequence[torch.Tensor],
    retain_grads: Sequence[torch.Tensor],
    strategy: str,
    forget_weight: float = 1.0,
    retain_weight: float = 1.0,
) -> list[torch.Tensor]:
    """Pure version of :func:`combine_gradients_`: new tensors, inputs untouched (same shapes in, same out)."""
    copies = [None if r is None else r.clone() for r in retain_grads]
    updates, _ = combine_gradients_(forget_grads, copies, strategy, forget_weight, retain_weight)
    return updates
