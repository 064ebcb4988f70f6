"""The supervised trainer classes, one per Ultralytics task, and ``TRAINERS``.

They live at module level because Ultralytics' DDP script imports the trainer class by module and name in every rank
(``worker/distributed/ddp.py``).
"""

from __future__ import annotations

from ultralytics.models import yolo

from worker.supervision.exact_resume import patch_training_loop_enumerate
from worker.training.trainer import SupervisedTrainerMixin


class SupervisedDetectionTrainer(SupervisedTrainerMixin, yolo.detect.DetectionTrainer):
    pass


class SupervisedSegmentationTrainer(SupervisedTrainerMixin, yolo.segment.SegmentationTrainer):
    pass


class SupervisedPoseTrainer(SupervisedTrainerMixin, yolo.pose.PoseTrainer):
    pass


class SupervisedOBBTrainer(SupervisedTrainerMixin, yolo.obb.OBBTrainer):
    pass


class SupervisedClassificationTrainer(SupervisedTrainerMixin, yolo.classify.ClassificationTrainer):
    pass


TRAINERS: dict[str, type] = {"detect": SupervisedDetectionTrainer, "segment": SupervisedSegmentationTrainer,
                             "pose": SupervisedPoseTrainer, "obb": SupervisedOBBTrainer,
                             "classify": SupervisedClassificationTrainer}


def supervised_trainer(task: str) -> type:
    """The supervised trainer class of a task: importable by module and name (this module), as Ultralytics' DDP
    script imports it in every rank."""
    patch_training_loop_enumerate()
    return TRAINERS[task]
