"""Distributed training engine: runs under torchrun, without Prefect.

    torchrun --nproc-per-node 2 -m training.worker --config configs/digits.yaml --out out/
"""

import tasks  # noqa: F401 - the tasks' config options join core.config's schema before a config loads
