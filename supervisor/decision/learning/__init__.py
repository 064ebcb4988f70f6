"""What the run learns from its hangs and its work: the ladder's choices read from the records (``choices``), what a
hang's evidence weighs (``hang_evidence``), the work kept and lost (``goodput``).
May import: what ``stall`` may, and ``stall``.
"""
