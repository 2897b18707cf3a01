"""Retention-first gradient surgery (arXiv 2604.14808): pure combinations of the forget and retain gradients
(:mod:`.combine`) and their use inside Trainer's step (:mod:`.in_training`)."""

from .combine import STRATEGIES, SURGERY_PAPER, combine_gradients, combine_gradients_, local_shards
from .in_training import SurgeryBuffers

__all__ = ["STRATEGIES", "SURGERY_PAPER", "SurgeryBuffers", "combine_gradients", "combine_gradients_", "local_shards"]
