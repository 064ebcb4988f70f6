"""Checkpoints written whole: the atomic write of Ultralytics' saves and the background writer."""
