"""The Ray Train face: ``Checkpointer`` (job, rank and world size from the run),
``InPlaceRecovery`` (survivors keep their processes; only lost workers are replaced), and
``job_name`` / ``default_backup_uri`` (what the Checkpointer derives from the run).

Import rule (tests/unit/test_layout.py): ``train`` imports the Checkpointer stack, the
transport, the core and the actors; nothing below it imports ``train``.
"""

from ray_ckpt.train.checkpointer import Checkpointer, default_backup_uri, job_name
from ray_ckpt.train.inplace import InPlaceRecovery

__all__ = ["Checkpointer", "InPlaceRecovery", "default_backup_uri", "job_name"]
