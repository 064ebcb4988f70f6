"""Exit statuses of ``yolo-train run``; the systemd unit's RestartPreventExitStatus= names the ones not worth a restart."""

EXIT_OK = 0
EXIT_FAILED = 1           # the restart budget is spent, or training cannot go on; systemd may try again later
EXIT_USAGE = 2            # bad command line (argparse)
EXIT_REBOOT_NEEDED = 3    # a worker survived SIGKILL or the GPU is lost: only a reboot helps
EXIT_CONFIG = 78          # EX_CONFIG from sysexits.h: the configuration is wrong; restarting cannot help
