"""`python -m hf_unlearn.cli COMMAND ...`, as `hf-unlearn COMMAND ...` (e.g. under `accelerate launch -m`)."""

import sys

from .main import main

sys.exit(main())
