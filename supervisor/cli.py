"""``yolo-train``: run the supervisor, show its status, check the machine, install the service."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from supervisor.config import ConfigError, load
from supervisor.exit_codes import EXIT_CONFIG, EXIT_USAGE
from worker.faults import Fault, FaultError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="yolo-train", description="Supervised Ultralytics training that "
                                     "recovers from hangs by itself.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train under the supervisor, in the foreground")
    run.add_argument("--config", type=Path, help="TOML config (default: the embedded demo)")
    run.add_argument("--state-dir", type=Path, help="override the config's state_dir")
    run.add_argument("--fault", action="append", default=[], metavar="SPEC",
                     help="inject a fault, e.g. dataloader_hang,at_batch=6,attempt=1 (repeatable)")
    status = commands.add_parser("status", help="the live state of the supervisor for a config")
    status.add_argument("--config", type=Path, help="TOML config (default: the embedded demo)")
    status.add_argument("--state-dir", type=Path, help="override the config's state_dir")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    incidents = commands.add_parser("incidents", help="the incidents grouped by where they hung, the newest in full")
    incidents.add_argument("--config", type=Path, help="TOML config (default: the embedded demo)")
    incidents.add_argument("--state-dir", type=Path, help="override the config's state_dir")
    incidents.add_argument("--json", action="store_true", help="machine-readable output")
    report = commands.add_parser("report", help="the night as one offline HTML page: timeline, incidents, goodput")
    report.add_argument("--config", type=Path, help="TOML config (default: the embedded demo)")
    report.add_argument("--state-dir", type=Path, help="override the config's state_dir")
    report.add_argument("-o", "--output", type=Path, default=Path("night.html"), help="the HTML file to write "
                        "(default: night.html)")
    report.add_argument("--png", action="store_true", help="also write the timeline as a picture (OUTPUT.png)")
    check = commands.add_parser("check-config", help="validate a config and print the ladder")
    check.add_argument("--config", type=Path)
    check.add_argument("--portable", action="store_true", help="check the file alone, not this machine's data file "
                       "and GPUs (for a file that trains on another machine); `run` always checks them")
    commands.add_parser("doctor", help="check torch, ROCm, GPU access, kernel log and disk", add_help=False)
    commands.add_parser("install-service", help="install the systemd unit, config, user and directories",
                        add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _open_standard_streams()
    try:
        return _main(argv)
    except BrokenPipeError:
        if argv[:1] == ["run"]:
            raise  # run prints nothing a reader could stop reading: this one is a bug to see
        # The reader stopped early (`check-config | head`) and wants no more: no traceback, and stdout goes to
        # /dev/null so the interpreter's flush at exit does not fail on it again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _open_standard_streams() -> None:
    """A closed stdin, stdout or stderr (``2>&-``) becomes /dev/null: Python leaves it None, on which the first
    write raises, and the supervisor's own pipes must not take descriptors 0-2, which its children inherit as theirs."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


def _main(argv: list[str]) -> int:
    if argv[:1] == ["doctor"]:  # these two own their options
        from supervisor.verbs.doctor import doctor_main

        return doctor_main(argv[1:])
    if argv[:1] == ["install-service"]:
        from supervisor.verbs.install_service import install_service_main

        return install_service_main(argv[1:])
    args = build_parser().parse_args(argv)
    logger = logging.getLogger("yolo-train")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    from supervisor.telemetry.systemd_notify import journal_logging, under_journal

    if under_journal():
        journal_logging(logger)  # structured fields (RUNG=, ATTEMPT=, INCIDENT_ID=) in the journal
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("yolo-train: %(message)s"))
        logger.addHandler(handler)
    try:
        config = load(args.config, getattr(args, "state_dir", None))
        if args.command == "run":
            from dataclasses import replace

            from supervisor.agent import run
            from supervisor.host import machine_fit

            try:
                extra = tuple(Fault.parse(spec) for spec in args.fault)
            except FaultError as e:
                raise ConfigError(f"--fault: {e}") from None
            machine_fit.check(config)  # before the state directory is taken: nothing is written for what cannot run
            return run(replace(config, faults=config.faults + extra))
        if args.command == "status":
            from supervisor.verbs.status import status_main

            return status_main(config, as_json=args.json)
        if args.command == "incidents":
            from supervisor.verbs.incidents import incidents_main

            return incidents_main(config.state_dir, json_output=args.json)
        if args.command == "report":
            from supervisor.verbs.report import report_main

            return report_main(config, args.output, png=args.png)
        if args.command == "check-config":
            from supervisor.host import machine_fit
            from supervisor.host.torch_build import ladder_for
            from supervisor.telemetry.notify_command import not_found

            missing = not_found(config.notify.command)
            if missing:
                raise ConfigError(f"{config.source}: notify.command: {missing}; give the program's full path or "
                                  f"install it")
            if not args.portable:
                machine_fit.check(config)
            ladder = ladder_for(config)
            print(f"{config.source}: ok; state_dir {config.state_dir}")
            for i in range(len(ladder)):
                print(f"  rung {i}: {ladder.label(i)}")
            return 0
    except ConfigError as e:
        print(f"yolo-train: {e}", file=sys.stderr)
        return EXIT_CONFIG
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
