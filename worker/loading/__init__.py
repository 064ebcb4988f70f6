"""The training's DataLoaders: per-pass and thread loaders, and the rebuild of a loader whose workers were replaced."""
