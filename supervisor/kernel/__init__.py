"""Floor 5, the kernel's word on the GPU: the kernel log (/dev/kmsg or the journal, ``reader``), the catalogue of
the lines that matter (``catalogue``, each pattern citing the kernel function that prints it), udev's drm events
(``gpu_events``), and ``sources``, which opens them for the agent and turns a line into ``core.KernelMessage``.
May import: the floors below (ground, configuration, ``decision``, ``host``, ``state``); not ``attempt`` or
``telemetry`` beside it.
"""
