"""Floor 2, the pure decision: what the supervisor does next, and every rule that reads a record, with no I/O.

Its sub-wings, lowest first; each imports only its own and those below it (tests/test_floors.py holds it):
``model`` (the records: events, actions, state, incidents, the ladder; and their arithmetic: rung choice, the
checkpoint interval, persistence), ``stall`` (the stall judge: the watchdog, the witness's word, what stacks say),
``learning`` (the ladder's choices, goodput), ``recovery`` (a hang's tiers walked cheapest first: ``in_place``,
``restart``, ``standby``; stopping, what follows any stop, probing), and on top the handlers: ``core.decide``
(every event), ``heartbeats``, ``kernel``, ``status_view`` (the status users script against) and ``notices``.
The shell reads this package through the names below alone (tests/decision/test_face.py holds it).
May import: the standard library, the ground floor (``supervisor.vocabulary``, ``supervisor.exit_codes``,
``worker.wire.contract``) and the configuration. Nothing here opens a file, reads a clock or starts a process.
"""

from supervisor.decision.core import Supervision, decide, restore
from supervisor.decision.model.actions import (AwaitSurvivors, DropStacksAhead, Exit, IncidentResumed,
                                               KeepDevcoredumps, KeepVerifiedCopy, KillTree, Log, PrepareStandby, PrimeStandby, PublishCheckpoint,
                                               PublishLadder, ReadStacksAhead, RecordIncident, RequestCheckpoint, Spawn)
from supervisor.decision.model.events import (Boot, DevcoredumpsKept, HeartbeatReceived, IncidentEnriched, JobCheckpointRead,
                                              JobLadderRead, KernelMessage, Now, SearchNews, SignatureSeen, Spawned,
                                              StacksReadAhead, StateDirTaken, StopRequested, SupervisorPaused,
                                              SurvivorsGone, Tick, TreeActivity, TreeKilled, VerifiedCopyKept,
                                              WeightsKept, WorkerExited)
from supervisor.decision.model.incident import Devcoredump, Incident, Stacks, one_line, where_of
from supervisor.decision.model.ladder import Ladder, build_ladder
from supervisor.decision.model.miopen_modes import MiopenRun, setting as miopen_setting, table as miopen_table
from supervisor.decision.model.persistence import Unreadable
from supervisor.decision.model.signatures import scan
from supervisor.decision.model.survivors import Survivor
from supervisor.decision.model.worker_kind import WorkerKind
from supervisor.decision.notices import Notice, NoticeLimit, derive
from supervisor.decision.recovery.in_place import (InspectStall, LoaderWorkersKilled, ReplaceLoaderWorkers,
                                                   StallInspected)
from supervisor.decision.stall.loader_judgement import judge
from supervisor.decision.stall.stack_reading import (UNTRACEABLE_STATES, Frame, ProcessStacks, ThreadStack, TreeCapture,
                                                     as_incident_stacks)
from supervisor.decision.stall.watchdog import counted_threads
from supervisor.decision.status_view import Heartbeats, Status, Supervisor, snapshot

__all__ = ["as_incident_stacks", "AwaitSurvivors", "Boot", "build_ladder", "counted_threads", "decide", "derive",
           "Devcoredump", "DevcoredumpsKept", "DropStacksAhead",
           "Exit", "Frame", "HeartbeatReceived", "Heartbeats", "Incident", "IncidentEnriched", "IncidentResumed",
           "InspectStall",
           "JobCheckpointRead", "JobLadderRead", "judge", "KeepDevcoredumps", "KeepVerifiedCopy", "KernelMessage",
           "KillTree", "Ladder", "LoaderWorkersKilled", "Log", "miopen_setting", "miopen_table", "MiopenRun", "Notice",
           "NoticeLimit", "Now", "one_line", "PrepareStandby", "PrimeStandby", "ProcessStacks",
           "PublishCheckpoint", "PublishLadder", "ReadStacksAhead", "RecordIncident", "ReplaceLoaderWorkers",
           "RequestCheckpoint", "restore", "scan", "SearchNews", "SignatureSeen", "snapshot", "Spawn", "Spawned", "Stacks",
           "StacksReadAhead", "StallInspected", "StateDirTaken", "Status", "StopRequested", "Supervision", "Supervisor",
           "SupervisorPaused", "Survivor", "SurvivorsGone", "ThreadStack", "Tick",
           "TreeActivity", "TreeCapture", "TreeKilled", "Unreadable", "UNTRACEABLE_STATES", "VerifiedCopyKept",
           "WeightsKept", "where_of", "WorkerExited", "WorkerKind"]
