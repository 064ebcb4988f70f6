"""The stall judge: when the watchdog fires (``watchdog``), what the training process said it waits on
(``witness``), what a capture of stacks says (``stack_reading``, ``loader_judgement``) and a kernel search under
way (``kernel_search``).
May import: what ``model`` may, and ``model``.
"""
