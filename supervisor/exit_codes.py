"""Exit statuses of ``yolo-train run``; the systemd unit's RestartPreventExitStatus= names the ones not worth a restart."""

# 78 (EX_CONFIG) is the worker's too, for a launch it refuses for good: defined in the contract both sides import.
from worker.wire.contract import EXIT_CONFIG  # noqa: F401  (the configuration is wrong; restarting cannot help)

EXIT_OK = 0
EXIT_FAILED = 1           # the restart budget is spent, or training cannot go on; systemd may try again later
EXIT_USAGE = 2            # bad command line (argparse)
EXIT_REBOOT_NEEDED = 3    # a worker survived SIGKILL or the GPU is lost: only a reboot helps
EXIT_NO_WEIGHTS = 73      # EX_CANTCREAT: training ran to its end and no file of its weights could be kept (a full disk)
