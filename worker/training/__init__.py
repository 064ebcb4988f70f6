"""The training itself: the worker's main, the supervised trainer and the trainers of each task."""
