"""``yolo-train``: run the supervisor, show its status, check the machine, install the service."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from supervisor.config import Config, ConfigError, load
from supervisor.exit_codes import EXIT_CONFIG
from worker.wire.fault_spec import Fault, FaultError


def _run(config: Config, args: argparse.Namespace) -> int:
    from dataclasses import replace

    from supervisor.agent import run
    from supervisor.host import machine_fit

    try:
        extra = tuple(Fault.parse(spec) for spec in args.fault)
    except FaultError as e:
        raise ConfigError(f"--fault: {e}") from None
    machine_fit.check(config)  # before the state directory is taken: nothing is written for what cannot run
    return run(replace(config, faults=config.faults + extra))


def _status(config: Config, args: argparse.Namespace) -> int:
    from supervisor.verbs.status import status_main

    return status_main(config, as_json=args.json)


def _incidents(config: Config, args: argparse.Namespace) -> int:
    from supervisor.verbs.incidents import incidents_main

    return incidents_main(config.state_dir, json_output=args.json)


def _report(config: Config, args: argparse.Namespace) -> int:
    from supervisor.verbs.report import report_main

    return report_main(config, args.output, png=args.png)


def _check_config(config: Config, args: argparse.Namespace) -> int:
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


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fault", action="append", default=[], metavar="SPEC",
                        help="inject a fault, e.g. dataloader_hang,at_batch=6,attempt=1 (repeatable)")


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _check_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--portable", action="store_true", help="check the file alone, not this machine's data file "
                        "and GPUs (for a file that trains on another machine); `run` always checks them")


def _report_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", type=Path, default=Path("night.html"), help="the HTML file to write "
                        "(default: night.html)")
    parser.add_argument("--png", action="store_true", help="also write the timeline as a picture (OUTPUT.png)")


@dataclass(frozen=True)
class Verb:
    """A verb that reads a config: its help line, its own options, and what it does with the config loaded."""
    help: str
    run: Callable[[Config, argparse.Namespace], int]
    options: Callable[[argparse.ArgumentParser], None] | None = None
    state_dir: bool = True  # it takes --state-dir, over the config's state_dir


# Every verb that reads a config, in the order of `yolo-train --help`; a new one is its row here and its module in
# verbs/. doctor and install-service own their options (OWN_OPTIONS).
VERBS: dict[str, Verb] = {
    "run": Verb("train under the supervisor, in the foreground", _run, _run_options),
    "status": Verb("the live state of the supervisor for a config", _status, _json_option),
    "incidents": Verb("the incidents grouped by where they hung, the newest in full", _incidents, _json_option),
    "report": Verb("the night as one offline HTML page: timeline, incidents, goodput", _report, _report_options),
    "check-config": Verb("validate a config and print the ladder", _check_config, _check_options, state_dir=False),
}
OWN_OPTIONS = {"doctor": "check torch, ROCm, GPU access, kernel log and disk",
               "install-service": "install the systemd unit, config, user and directories"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="yolo-train", description="Supervised Ultralytics training that "
                                     "recovers from hangs by itself.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, verb in VERBS.items():
        sub = commands.add_parser(name, help=verb.help)
        sub.add_argument("--config", type=Path, help="TOML config (default: the embedded demo)")
        if verb.state_dir:
            sub.add_argument("--state-dir", type=Path, help="override the config's state_dir")
        if verb.options is not None:
            verb.options(sub)
    for name, help_line in OWN_OPTIONS.items():
        commands.add_parser(name, help=help_line, add_help=False)
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
        return VERBS[args.command].run(config, args)
    except ConfigError as e:
        print(f"yolo-train: {e}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
