"""Notes of third-party libraries that a user cannot act on, caught before this package first imports them.

bitsandbytes is imported by transformers and peft whenever this package is (``transformers.trainer_utils`` imports
peft, which imports bitsandbytes). On a CPU with AVX-512 BF16, bitsandbytes (0.49+) then tries to fetch its 4-bit CPU
matmul from the optional ``kernels`` package (kernels-community on the Hub) and, when that package is not installed,
warns "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'" on its logger
``bitsandbytes.backends.cpu.ops``. It then uses the CPU kernel it ships itself (``libbitsandbytes_cpu``), which is
what the quantization check needs: the note is dropped, and said at info level instead. Every other record of that
logger passes.
"""

from __future__ import annotations

import logging

BITSANDBYTES_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
#: The start of bitsandbytes' warning when its optional kernel package is missing (bitsandbytes 0.49-0.50).
OPTIONAL_KERNEL_NOTE = "Failed to load CPU gemm_4bit_forward from kernels-community"
BUNDLED_KERNEL_INFO = (
    "bitsandbytes: 4-bit matmuls on this CPU (AVX-512 BF16) use the kernel bitsandbytes ships (libbitsandbytes_cpu), "
    "not kernels-community's, which needs the optional `kernels` package ({error})."
)


class OptionalKernelNoteFilter(logging.Filter):
    """Drops bitsandbytes' note that its optional CPU kernel package is missing and logs, at info level, which kernel
    is used instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(OPTIONAL_KERNEL_NOTE):
            return True
        error = record.args[0] if isinstance(record.args, tuple) and record.args else "not installed"
        # Imported here: bitsandbytes only speaks once transformers imported it, and `hf-unlearn --help` stays light.
        from transformers.utils import logging as hf_logging

        hf_logging.get_logger(__name__).info(BUNDLED_KERNEL_INFO.format(error=error))
        return False


def quiet_bitsandbytes_import() -> None:
    """Install :class:`OptionalKernelNoteFilter` on bitsandbytes' CPU backend logger (once); effective for an import
    of bitsandbytes that comes after it."""
    bnb_logger = logging.getLogger(BITSANDBYTES_CPU_LOGGER)
    if not any(isinstance(f, OptionalKernelNoteFilter) for f in bnb_logger.filters):
        bnb_logger.addFilter(OptionalKernelNoteFilter())


# On import: this module is the package's first import (hf_unlearn/__init__.py), before transformers imports peft.
quiet_bitsandbytes_import()


__all__ = [
    "BITSANDBYTES_CPU_LOGGER",
    "BUNDLED_KERNEL_INFO",
    "OPTIONAL_KERNEL_NOTE",
    "OptionalKernelNoteFilter",
    "quiet_bitsandbytes_import",
]
