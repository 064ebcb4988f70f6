"""Survivors of SIGKILL, judged by where the kernel holds them (their wchan, the real kernel's function names): a file
system's wait (a FUSE request its daemon holds, NFS, RPC) is waited for within survivor_timeout and the run goes on
once they are gone; only a driver's wait means a reboot (exit 3); a run without a GPU is never told of one."""

from supervisor.decision import core
from supervisor.decision.model.survivors import KernelWait, Survivor
from supervisor.decision.stall import watchdog
from supervisor.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_REBOOT_NEEDED
from tests.helpers.driver import PID, Driver, healthy, kinds

FUSE = (Survivor(5001, "pt_data_worker", "disk-sleep", ("request_wait_answer",)),
        Survivor(5002, "pt_data_worker", "disk-sleep", ("request_wait_answer",)))
NFS = Survivor(5003, "python", "disk-sleep", ("rpc_wait_bit_killable",))
DRIVER = Survivor(5004, "python", "disk-sleep", ("dma_fence_default_wait",))
UNNAMED = Survivor(5005, "python", "disk-sleep", ())
CPU = {"train": {"workers": 2, "epochs": 3, "device": "cpu"}}


def hung(**sections) -> Driver:
    """Training, then a hang in val that the restart takes: the tree is being killed."""
    d = healthy(**sections)
    d.at(d.t + 0.5).beat("val", kind="phase", epoch=1, epochs=3)
    d.at(d.t + 10.01)(core.Tick())
    assert d.s.state == core.State.STOPPING
    return d


def texts(actions) -> str:
    return " ".join(getattr(a, "text", "") for a in actions)


def test_the_kernel_functions_name_whose_wait_it_is():
    assert all(s.wait == KernelWait.FILE_SYSTEM for s in (*FUSE, NFS,
               Survivor(1, "p", "disk-sleep", ("nfs_wait_bit_killable",)),
               Survivor(1, "p", "disk-sleep", ("fuse_wait_on_page_writeback",))))
    assert DRIVER.wait == KernelWait.DRIVER and UNNAMED.wait == KernelWait.UNKNOWN
    assert Survivor(1, "p", "disk-sleep", ("kfd_wait_on_events", "request_wait_answer")).wait == KernelWait.DRIVER
    assert FUSE[0].describe() == "pid 5001 (pt_data_worker, disk-sleep, in request_wait_answer)"


def test_loader_workers_held_by_a_fuse_request_are_waited_for_then_the_next_worker_starts_on_a_cpu_run():
    d = hung(**CPU)
    actions = d(core.TreeKilled(killed=4, survivors=FUSE))
    assert kinds(actions) == ["Log", "AwaitSurvivors"] and actions[1].pids == (5001, 5002)
    assert d.s.state == core.State.STOPPING and d.s.exit is None
    assert d.s.watch.deadline.at == d.t + 120  # survivor_timeout
    said = texts(actions)
    assert "file system" in said and "request_wait_answer" in said and "GPU" not in said
    assert d.s.incidents[-1].kill.survivors[0] == "pid 5001 (pt_data_worker, disk-sleep, in request_wait_answer)"
    assert d.at(d.t + 5)(core.Tick()) == []  # still waiting
    actions = d.at(d.t + 5)(core.SurvivorsGone())  # the blip is over: they died ~10 s after the kill
    assert "Spawn" in kinds(actions) and d.s.state == core.State.STARTING and d.s.exit is None
    assert "gone after 10.0 s" in texts(actions) and not d.s.reboot_needed
    assert d.s.stop is None  # no survivor deadline left behind


def test_a_file_system_that_never_answers_ends_the_run_with_exit_1_without_a_word_of_gpus():
    d = hung(**CPU, watchdog={"survivor_timeout": 30})
    d(core.TreeKilled(killed=3, survivors=(FUSE[0], NFS)))
    actions = d.at(d.t + 30)(core.Tick())
    exit = [a for a in actions if isinstance(a, core.Exit)][0]
    assert exit.code == EXIT_FAILED and "request_wait_answer" in exit.text and "rpc_wait_bit_killable" in exit.text
    assert "GPU" not in exit.text and "reboot" not in exit.text and "mount" in exit.text
    assert not d.s.reboot_needed


def test_a_driver_wait_means_reboot_at_once_and_a_gpu_run_hears_of_its_gpu():
    d = hung()
    actions = d(core.TreeKilled(killed=3, survivors=(FUSE[0], DRIVER)))
    exit = [a for a in actions if isinstance(a, core.Exit)][0]
    assert exit.code == EXIT_REBOOT_NEEDED and "GPU driver" in exit.text and "dma_fence_default_wait" in exit.text
    assert "AwaitSurvivors" not in kinds(actions)


def test_an_unnamed_wait_is_waited_for_then_taken_for_the_driver_only_where_the_run_has_a_gpu():
    gpu = hung()
    assert "AwaitSurvivors" in kinds(gpu(core.TreeKilled(killed=2, survivors=(UNNAMED,))))
    exit = [a for a in gpu.at(gpu.t + 120)(core.Tick()) if isinstance(a, core.Exit)][0]
    assert exit.code == EXIT_REBOOT_NEEDED and "GPU driver" in exit.text
    cpu = hung(**CPU)
    cpu(core.TreeKilled(killed=2, survivors=(UNNAMED,)))
    exit = [a for a in cpu.at(cpu.t + 120)(core.Tick()) if isinstance(a, core.Exit)][0]
    assert exit.code == EXIT_FAILED and "GPU" not in exit.text


def test_a_stop_while_survivors_are_waited_for_ends_the_run_at_once():
    d = hung(**CPU)
    d(core.TreeKilled(killed=4, survivors=FUSE))
    actions = d.at(d.t + 1)(core.StopRequested("SIGTERM"))
    exit = [a for a in actions if isinstance(a, core.Exit)][0]
    assert exit.code == EXIT_OK and d.s.state == core.State.STOPPED and "run again to resume" in exit.text
    assert d(core.SurvivorsGone()) == []  # too late to matter


def test_survivors_gone_after_a_finished_run_end_it_as_finished():
    d = Driver(healthy(**CPU).s)
    d.t, d.progress = 1010.0, 100
    d.beat("done", kind="phase", pid=PID)
    d(core.WorkerExited(0))
    d(core.TreeKilled(killed=2, survivors=(FUSE[0],)))
    actions = d.at(d.t + 3)(core.SurvivorsGone())
    assert [a.code for a in actions if isinstance(a, core.Exit)] == [EXIT_OK] and d.s.state == core.State.SUCCEEDED
