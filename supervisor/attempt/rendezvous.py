"""Several hosts: what this host's worker needs to meet the others at torch.distributed's c10d rendezvous.

The supervisor imports no torch; the worker launches its ranks with torch.distributed.run's c10d rendezvous
(``worker/distributed/multinode.py``) from the ``Rendezvous`` in its launch record, made here from ``[distributed]``.
"""

from __future__ import annotations

import hashlib
import json

from supervisor.config import Config
from worker.wire.contract import Rendezvous

ENV_COLLECTIVE_TIMEOUT = "YOLO_TRAIN_COLLECTIVE_TIMEOUT"  # worker/distributed/ddp.py reads it in every rank (that module imports
# torch, so its name is repeated here; tests/e2e/test_multinode.py checks they agree)


def rendezvous_of(config: Config) -> Rendezvous | None:
    """The launch record's rendezvous; None on one host."""
    d = config.distributed
    if not d.several_hosts:
        return None
    # What every host must agree on, or their ranks would train different things in one all-reduce.
    agreed = {"train": config.train, "ladder": config.ladder, "nnodes": d.nnodes, "rdzv_id": d.rdzv_id,
              "run_dir": str(d.run_dir)}
    fingerprint = hashlib.sha256(json.dumps(agreed, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Rendezvous(nnodes=d.nnodes, node_rank=d.node_rank, endpoint=d.rdzv_endpoint, rdzv_id=d.rdzv_id,
                      join_timeout=d.join_timeout, fingerprint=fingerprint)
