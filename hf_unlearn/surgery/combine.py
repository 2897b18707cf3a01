"""Retention-first gradient surgery: combine the forget gradient g_f with the retain gradient g_r.

Pure functions over lists of per-parameter tensors. "Module-wise" means per parameter tensor. Reference:
Xiao et al., "Modeling LLM Unlearning as an Asymmetric Two-Task Learning Problem", ACL 2026, arXiv 2604.14808
(retain is the primary task, forget the auxiliary one; SAGO and module-wise PCGrad); PCGrad after Yu et al.,
"Gradient Surgery for Multi-Task Learning", NeurIPS 2020. Everything stays on the gradients' device: no value is
read back to the host, so a step costs no synchronisation on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

STRATEGIES = ("sum", "pcgrad", "pcgrad_global", "sago", "sago_prefer_retain", "blur", "blur_per_tensor")
EPS = 1e-10
SURGERY_PAPER = (
    "Modeling LLM Unlearning as an Asymmetric Two-Task Learning Problem",
    "https://arxiv.org/abs/2604.14808",
    "Xiao et al.",
)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Dot product of two same-shape tensors as a float64 0-dim tensor (no float64 copy of fp32 inputs)."""
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


# SAGO works through each tensor in blocks this size with one reused scratch buffer: a fresh full-size
# temporary per tensor per step costs more in page faults than the arithmetic itself.
_BLOCK = 1 << 18


def _sago_(
    forget: torch.Tensor,
    retain: torch.Tensor,
    out: torch.Tensor,
    drop_retain: bool,
    gamma: float,
    alpha: float,
    stats: dict[str, torch.Tensor] | None,
) -> None:
    """SAGO into ``out`` (which may be ``retain``); the forget tensor is used as scratch.

    ``sago``: ``alpha r`` where the signs conflict, ``gamma f`` elsewhere; ``sago_prefer_retain``:
    ``alpha r + gamma f`` with f zeroed where they conflict. The conflict test is ``f * r < 0`` (opposite
    signs; a zero never conflicts). Selection is done by multiplying with the 0/1 indicator and its complement,
    which is exact and, on CPU, several times faster than ``torch.where`` or ``masked_fill``. With ``stats``,
    adds this tensor's conflicting coordinates and ``<u, g_r>``, ``||u||^2`` to it, on the device.
    """
    shape = out.shape
    f, r = forget.reshape(-1), retain.reshape(-1)
    in_place = out.data_ptr() == retain.data_ptr() and retain.is_contiguous() and forget.is_contiguous()
    if not in_place:
        f, r = f.contiguous().clone(), r.contiguous().clone()
    block = min(_BLOCK, f.numel())
    indicator = torch.empty(block, dtype=f.dtype, device=f.device)
    retain_before = torch.empty(block, dtype=f.dtype, device=f.device) if stats is not None else None
    for start in range(0, f.numel(), block):
        end = min(start + block, f.numel())
        fb, rb, conflict = f[start:end], r[start:end], indicator[: end - start]
        if retain_before is not None:
            retain_before[: end - start].copy_(rb)
        torch.mul(fb, rb, out=conflict).lt_(0)  # 1.0 where the signs conflict, else 0.0
        if stats is not None:
            stats["conflicts"] += conflict.sum(dtype=torch.float64)
        if drop_retain:
            rb.mul_(conflict)
        if alpha != 1.0:
            rb.mul_(alpha)
        keep = conflict.sub_(1).neg_()  # 1.0 where they do not conflict
        rb.addcmul_(fb, keep, value=gamma)
        if stats is not None:
            stats["dot_ur"] += _dot(rb, retain_before[: end - start])
            stats["norm_u2"] += _dot(rb, rb)
    if not in_place:
        out.copy_(r.view(shape))


def combine_gradients_(
    forget_grads: Sequence[torch.Tensor | None],
    retain_grads: Sequence[torch.Tensor | None],
    strategy: str,
    forget_weight: float = 1.0,
    retain_weight: float = 1.0,
    with_stats: bool = True,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor | None], dict[str, torch.Tensor]]:
    """Combine in place: the update is written into the retain tensors, the forget tensors are consumed.

    Sharded gradients (FSDP2's DTensor shards, see :func:`local_shards`): pass each process's *local shard* of
    every tensor, in the same order on every process, and ``reduce_sum``, a sum across processes (e.g. an
    all-reduce). SAGO is elementwise and needs nothing; the per-tensor dot products and norms of PCGrad and BLUR,
    and the statistics, are summed across processes (one collective for the scalars, one more for SAGO's
    statistics), so each shard gets exactly the update of the unsharded tensor.

    Formulas (arXiv 2604.14808 §3), with gamma = ``forget_weight``, alpha = ``retain_weight``:

    * ``sum``: ``u = gamma g_f + alpha g_r``.
    * ``pcgrad``: per tensor, if ``<g_f, g_r> < 0`` project g_f off g_r:
      ``g_f' = g_f - <g_f,g_r> / (||g_r||^2 + 1e-10) g_r``; ``u = gamma g_f' + alpha g_r``.
    * ``pcgrad_global``: the same with the dot product and norm over all tensors.
    * ``sago``: elementwise conflict ``c = sign(g_f) sign(g_r) < 0``; ``u = alpha g_r 1[c] + gamma g_f 1[not c]``.
    * ``sago_prefer_retain``: ``u = alpha g_r + gamma g_f 1[not c]``.
    * ``blur`` (forget-priority baseline, SAGO's BLUR): ``u = alpha (g_r - <g_r,g_f>/(||g_f||^2 + 1e-10) g_f) +
      gamma g_f`` with the dot product and norm over all tensors, always applied (no conflict test), as in the
      SAGO reference code; ``blur_per_tensor`` takes them per tensor instead.

    With ``with_stats`` it also returns, as float64 0-dim tensors on the gradients' device (nothing is read back
    to the host): ``cos_forget_retain``, ``cos_update_retain`` (>= 0 for the retention-first strategies) and
    ``conflict_fraction`` (coordinates for sago, tensors for pcgrad, 0 or 1 for pcgrad_global).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown gradient surgery {strategy!r}; choose one of {STRATEGIES}.")
    pairs = _dense(forget_grads, retain_grads)
    present = [f for f, _ in pairs if f is not None]
    device = present[0].device if present else torch.device("cpu")
    scalars, totals = _dot_products(pairs, strategy, with_stats, reduce_sum, device)
    stats = {"conflicts": _zero(device), "dot_ur": _zero(device), "norm_u2": _zero(device)} if with_stats else None
    total_units = 0
    updates: list[torch.Tensor | None] = []
    for (f, r), original, entry in zip(pairs, retain_grads, scalars):
        if f is None:
            updates.append(None)
            continue
        out = original if original is not None else r
        if strategy in ("sago", "sago_prefer_retain"):
            _sago_(f, r, out, strategy == "sago", forget_weight, retain_weight, stats)
            total_units += f.numel()
        else:
            total_units += _linear_update_(f, r, out, strategy, entry, totals, forget_weight, retain_weight, stats)
        updates.append(out)
    if not with_stats:
        return updates, {}
    return updates, _statistics(stats, totals, total_units, strategy, reduce_sum, device)


def _zero(device: torch.device) -> torch.Tensor:
    return torch.zeros((), dtype=torch.float64, device=device)


def _dot_products(
    pairs: list[tuple[torch.Tensor | None, torch.Tensor | None]],
    strategy: str,
    with_stats: bool,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None,
    device: torch.device,
) -> tuple[list[tuple | None], dict[str, torch.Tensor]]:
    """Per tensor, ``(<f, r>, ||f||^2, ||r||^2)`` where the strategy or the statistics need them (``None`` where not),
    summed across processes with ``reduce_sum``, and their totals over all tensors (``fr``, ``ff``, ``rr``)."""
    needs_fr = with_stats or strategy in ("pcgrad", "pcgrad_global", "blur", "blur_per_tensor")
    needs_ff = with_stats or strategy in ("blur", "blur_per_tensor")
    needs_rr = with_stats or strategy in ("pcgrad", "pcgrad_global")
    scalars = []
    for f, r in pairs:
        if f is None:
            scalars.append(None)
            continue
        scalars.append(
            (
                _dot(f, r).to(device) if needs_fr else None,
                _dot(f, f).to(device) if needs_ff else None,
                _dot(r, r).to(device) if needs_rr else None,
            )
        )
    if reduce_sum is not None and needs_fr | needs_ff | needs_rr:
        scalars = _summed_across_processes(scalars, reduce_sum, device)
    totals = {"fr": _zero(device), "ff": _zero(device), "rr": _zero(device)}
    for entry in scalars:
        if entry is not None:
            for key, value in zip(("fr", "ff", "rr"), entry):
                if value is not None:
                    totals[key] += value
    return scalars, totals


def _linear_update_(
    f: torch.Tensor,
    r: torch.Tensor,
    out: torch.Tensor,
    strategy: str,
    entry: tuple,
    totals: dict[str, torch.Tensor],
    forget_weight: float,
    retain_weight: float,
    stats: dict[str, torch.Tensor] | None,
) -> int:
    """Every strategy but SAGO's: ``u = a g_r + b g_f`` with a, b scalars (0-dim tensors, never read on the host),
    written into ``out``; the statistics' sums updated. Returns the units that count towards the conflict fraction
    (1 tensor for the PCGrad strategies, else 0)."""
    fr, ff, rr = entry
    device = totals["fr"].device
    a = torch.full((), retain_weight, dtype=torch.float64, device=device)
    b = torch.full((), forget_weight, dtype=torch.float64, device=device)
    units = 0
    if strategy in ("pcgrad", "pcgrad_global"):
        dot, norm2 = (totals["fr"], totals["rr"]) if strategy == "pcgrad_global" else (fr, rr)
        conflict = dot < 0
        a = a - forget_weight * torch.where(conflict, dot / (norm2 + EPS), torch.zeros_like(dot))
        if stats is not None and strategy == "pcgrad":
            stats["conflicts"] += conflict.double()
        units = 1
    elif strategy in ("blur", "blur_per_tensor"):
        dot, norm2 = (totals["fr"], totals["ff"]) if strategy == "blur" else (fr, ff)
        b = b - retain_weight * dot / (norm2 + EPS)
    if strategy == "sum":
        if retain_weight != 1.0:
            r.mul_(retain_weight)
        r.add_(f, alpha=forget_weight)
    else:
        r.mul_(a)
        r.addcmul_(f, b)  # r += b f, b a 0-dim tensor: no full-size temporary
    if r is not out:
        out.copy_(r)
    if stats is not None:
        # u = a r + b f, so <u, r> and ||u||^2 follow from the three dot products without another pass.
        stats["dot_ur"] += a * rr + b * fr
        stats["norm_u2"] += a * a * rr + 2 * a * b * fr + b * b * ff
    return units


def _statistics(
    stats: dict[str, torch.Tensor],
    totals: dict[str, torch.Tensor],
    total_units: int,
    strategy: str,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """``cos_forget_retain``, ``cos_update_retain`` and ``conflict_fraction`` from the sums over the tensors."""
    if reduce_sum is not None and strategy in ("sago", "sago_prefer_retain"):
        # SAGO's statistics are sums over each process's own coordinates; the other strategies built theirs from
        # scalars already summed across processes (and decide pcgrad's conflicts identically everywhere).
        local = torch.stack([stats["dot_ur"], stats["norm_u2"], stats["conflicts"], _zero(device) + total_units])
        stats["dot_ur"], stats["norm_u2"], stats["conflicts"], total_units = reduce_sum(local)
    if strategy == "pcgrad_global":
        stats["conflicts"] = (totals["fr"] < 0).double()
        total_units = 1
    # A tiny floor, not EPS: gradients of norm ~1e-5 (a loss near its minimum) would otherwise bias the cosines.
    cos_forget_retain = totals["fr"] / (totals["ff"].sqrt() * totals["rr"].sqrt()).clamp(min=1e-300)
    cos_update_retain = stats["dot_ur"] / (stats["norm_u2"].clamp(min=0).sqrt() * totals["rr"].sqrt()).clamp(
        min=1e-300
    )
    fraction = stats["conflicts"] / total_units if total_units else _zero(device)
    return {
        "cos_forget_retain": cos_forget_retain,
        "cos_update_retain": cos_update_retain,
        "conflict_fraction": fraction,
    }


def local_shards(
    forget_grads: Sequence[torch.Tensor | None], retain_grads: Sequence[torch.Tensor | None]
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None], Callable[[torch.Tensor], torch.Tensor] | None]:
    """What :func:`combine_gradients_` takes for gradients sharded by FSDP2 (``DTensor``): each process's local
    shards (views: the update written into a retain shard lands in its DTensor) and a sum across the processes of
    the shards' mesh. Plain tensors come back as they are, with no reduction."""
    sharded = next((g for g in [*forget_grads, *retain_grads] if g is not None and hasattr(g, "to_local")), None)
    if sharded is None:
        return list(forget_grads), list(retain_grads), None
    import torch.distributed as dist

    # Sum over the mesh dimensions the tensors are sharded on; on a 2-D (HSDP) mesh the replicated dimension already
    # holds equal gradients after its all-reduce, and summing over it too would count each shard twice.
    mesh = sharded.device_mesh
    groups = [mesh.get_group(dim) for dim, placement in enumerate(sharded.placements) if placement.is_shard()]

    def reduce_sum(value: torch.Tensor) -> torch.Tensor:
        value = value.clone()
        for group in groups:
            dist.all_reduce(value, group=group)
        return value

    def to_local(grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        return [None if g is None else g.to_local() if hasattr(g, "to_local") else g for g in grads]

    return to_local(forget_grads), to_local(retain_grads), reduce_sum


def _summed_across_processes(
    scalars: list[tuple[torch.Tensor | None, ...] | None],
    reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
) -> list[tuple[torch.Tensor | None, ...] | None]:
    """Every tensor's (<f, r>, ||f||^2, ||r||^2) summed across processes, in one collective."""
    rows = [
        torch.stack([v if v is not None else torch.zeros((), dtype=torch.float64, device=device) for v in entry])
        if entry is not None
        else torch.zeros(3, dtype=torch.float64, device=device)
        for entry in scalars
    ]
    if not rows:
        return scalars
    summed = reduce_sum(torch.stack(rows))
    return [
        None if entry is None else tuple(None if v is None else summed[i, j] for j, v in enumerate(entry))
        for i, entry in enumerate(scalars)
    ]


def combine_gradients(
    forget_grads: Sequence[torch.Tensor],
    retain_grads: Sequence[torch.Tensor],
    strategy: str,
    forget_weight: float = 1.0,
    retain_weight: float = 1.0,
) -> list[torch.Tensor]:
    """Pure version of :func:`combine_gradients_`: new tensors, inputs untouched (same shapes in, same out)."""
    forget = [None if f is None else f.clone() for f in forget_grads]
    retain = [None if r is None else r.clone() for r in retain_grads]
    updates, _ = combine_gradients_(forget, retain, strategy, forget_weight, retain_weight, with_stats=False)
    return updates
