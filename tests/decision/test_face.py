"""The shell reads the decision through its face alone: the names ``supervisor/decision/__init__.py`` exports, an
exact list held here. A shell module imports ``supervisor.decision`` (or names from it), never one of its modules."""

import ast

from tests.helpers.source_imports import ROOT
import supervisor.decision

FACE = sorted([
    # the events the shell sends
    "Boot", "DevcoredumpsKept", "HeartbeatReceived", "IncidentEnriched", "JobCheckpointRead", "JobLadderRead", "KernelMessage", "Now",
    "SearchNews", "SignatureSeen", "Spawned", "StacksReadAhead", "StallInspected", "LoaderWorkersKilled",
    "StateDirTaken", "StopRequested", "SupervisorPaused", "SurvivorsGone", "Tick", "TreeActivity", "TreeKilled",
    "WorkerExited", "WeightsKept", "VerifiedCopyKept",
    # the actions it carries out
    "AwaitSurvivors", "DropStacksAhead", "Exit", "IncidentResumed", "InspectStall", "KeepDevcoredumps", "KeepVerifiedCopy", "KillTree", "Log",
    "PrepareStandby", "PrimeStandby", "PublishCheckpoint", "PublishLadder", "ReadStacksAhead", "RecordIncident",
    "ReplaceLoaderWorkers", "RequestCheckpoint", "Spawn",
    # the reducer, its record (whose ``watch`` the shell's loop reads), its restore, and the threads a reading counts
    "Supervision", "decide", "restore", "counted_threads",
    # records and readings the shell builds or shows
    "Devcoredump", "Incident", "Stacks", "one_line", "where_of", "Ladder", "build_ladder", "MiopenRun", "miopen_setting",
    "miopen_table", "Unreadable", "scan", "Survivor",
    "WorkerKind", "judge", "UNTRACEABLE_STATES", "Frame", "ProcessStacks", "ThreadStack", "TreeCapture",
    "as_incident_stacks",
    # the status users script against, and the notices
    "Heartbeats", "Status", "Supervisor", "snapshot", "Notice", "NoticeLimit", "derive",
])


def shell_sources():
    return [p for p in sorted((ROOT / "supervisor").rglob("*.py")) if "decision" not in p.relative_to(ROOT).parts]


def test_the_face_exports_exactly_its_list():
    assert sorted(supervisor.decision.__all__) == FACE
    assert [n for n in FACE if not hasattr(supervisor.decision, n)] == []


def test_the_shell_imports_the_decision_only_through_its_face():
    wrong = []
    for path in shell_sources():
        tree = ast.parse(path.read_text())
        through_module = False
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("supervisor.decision"):
                wrong += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                          if node.module != "supervisor.decision" or a.name not in FACE]
            elif isinstance(node, ast.ImportFrom) and node.module == "supervisor":
                through_module |= any(a.name == "decision" for a in node.names)
            elif isinstance(node, ast.Import):
                wrong += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("supervisor.decision")]
        if through_module:
            wrong += [f"{path.name}: decision.{node.attr}" for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and isinstance(node.value, ast.Name) and node.value.id == "decision" and node.attr not in FACE]
    assert wrong == []
