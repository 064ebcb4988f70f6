"""Which MIOpen mode a run's settings give (decision/model/miopen_modes.py), as PyTorch's Conv_miopen.cpp asks for it
in each torch era and MIOpen's FindConvolution does it; docs/behaviour.md's table is the code's rendering; in the core
a kernel search's lines are news only where a search can happen, and the incident says the mode."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from supervisor.decision import MiopenRun, core
from supervisor.decision.model import miopen_modes
from supervisor.decision.model.miopen_modes import EXHAUSTIVE, FIND, IMMEDIATE
from supervisor.decision.stall import watchdog
from supervisor.verbs import miopen_reference
from tests.decision.stall.test_kernel_search import SEARCH, search
from tests.decision.stall.test_startup_steps import STEPS_OF_A_START, start, step
from tests.helpers.driver import COMMAND, Driver, kinds, make

ROOT = Path(__file__).resolve().parents[3]

# (torch, deterministic, benchmark, torch.backends.miopen.immediate) -> the mode, read off each era's source:
# <= 2.6 `if (benchmark) find else immediate`; 2.7-2.8 immediate iff deterministic && !benchmark; >= 2.9 immediate iff
# the flag, a find otherwise, exhaustive with benchmark.
EXPECTED = {
    **{((2, 6), d, False, i): IMMEDIATE for d in (False, True) for i in (False, True)},
    **{((2, 6), d, True, i): FIND for d in (False, True) for i in (False, True)},  # no immediate flag before 2.9
    ((2, 7), False, False, False): FIND, ((2, 7), True, False, False): IMMEDIATE,
    ((2, 8), True, True, False): EXHAUSTIVE, ((2, 8), False, True, True): EXHAUSTIVE,
    ((2, 8), True, False, True): IMMEDIATE,
    **{((2, v), d, False, False): FIND for v in (9, 14) for d in (False, True)},
    **{((2, v), d, True, False): EXHAUSTIVE for v in (9, 14) for d in (False, True)},
    **{((2, v), d, b, True): IMMEDIATE for v in (9, 14) for d in (False, True) for b in (False, True)},
}


@pytest.mark.parametrize("torch, deterministic, benchmark, immediate",
                         [k for k in itertools.product([(2, 6), (2, 7), (2, 8), (2, 9), (2, 14)], *[(False, True)] * 3)
                          if k in EXPECTED])
def test_the_mode_for_each_flag_combination(torch, deterministic, benchmark, immediate):
    assert miopen_modes.ask(torch, deterministic, benchmark, immediate) == EXPECTED[(torch, deterministic, benchmark,
                                                                                     immediate)]


def test_ultralytics_defaults_ask_immediate_mode_only_of_torch_2_7_and_2_8():
    """deterministic = True, benchmark never set: immediate on 2.7-2.8, a normal find on 2.9 and later."""
    assert [miopen_modes.ask(t, True, False) for t in ((2, 6), (2, 7), (2, 8), (2, 9), (2, 14))] == \
        [IMMEDIATE, IMMEDIATE, IMMEDIATE, FIND, FIND]


@pytest.mark.parametrize("env, searches, said", [
    ({}, False, "MIOPEN_FIND_MODE unset: DYNAMIC_HYBRID"),
    ({"MIOPEN_FIND_MODE": "fast"}, False, "MIOPEN_FIND_MODE=fast: FAST"),
    ({"MIOPEN_FIND_MODE": "2"}, False, "FAST"),
    ({"MIOPEN_FIND_MODE": "TRUST_VERIFY"}, True, "TRUST_VERIFY"),
    ({"MIOPEN_FIND_MODE": "7"}, True, "TRUST_VERIFY_FULL"),
    ({"MIOPEN_FIND_MODE": "nonsense"}, False, "DYNAMIC_HYBRID"),
    ({"MIOPEN_FIND_ENFORCE": "SEARCH"}, True, "MIOPEN_FIND_ENFORCE=SEARCH: every find tunes"),
    ({"MIOPEN_FIND_ENFORCE": "4"}, True, "MIOPEN_FIND_ENFORCE=SEARCH_DB_UPDATE"),
])
def test_what_the_miopen_variables_change_in_a_normal_find(env, searches, said):
    setting = miopen_modes.setting((2, 14), True, False, False, env)
    assert setting.mode == FIND and setting.searches is searches and said in setting.why


@pytest.mark.parametrize("env", [{}, {"MIOPEN_FIND_MODE": "FAST"}, {"MIOPEN_FIND_ENFORCE": "SEARCH"}])
def test_no_variable_changes_immediate_mode_and_none_stops_the_exhaustive_search(env):
    immediate = miopen_modes.setting((2, 8), True, False, False, env)
    assert immediate.mode == IMMEDIATE and not immediate.searches
    exhaustive = miopen_modes.setting((2, 14), True, True, False, env)
    assert exhaustive.mode == EXHAUSTIVE and exhaustive.searches and "changes nothing" in exhaustive.why


def test_the_docs_table_is_the_codes_rendering():
    page = (ROOT / "docs" / "behaviour.md").read_text()
    assert miopen_reference.block() in page
    assert miopen_reference.render(page) == page


# -- in the core ---------------------------------------------------------------------------------------------------

def rocm_run(torch=(2, 14), inherited=None, **sections) -> Driver:
    s = make(watchdog={"startup_timeout": 60}, **sections)
    s.miopen = MiopenRun(torch, inherited or {})
    d = Driver(s)
    d.boot_and_spawn()
    start(d, steps=STEPS_OF_A_START, first_batch=False)
    step(d, "first_step")
    return d


def test_where_no_search_can_happen_a_search_line_is_no_news_and_the_incident_says_the_mode():
    d = rocm_run()  # torch 2.14, Ultralytics' deterministic: a normal find, DYNAMIC_HYBRID: no tuning
    entered = d.t
    d.at(d.t + 30)(SEARCH[1])
    assert d.s.watch.deadline.at == entered + 60  # the step's own bound, from its entry
    actions = d.at(entered + 60.01)(core.Tick())
    incident = actions[-1].incident
    assert kinds(actions)[-1] == "KillTree" and incident.kernel_search is None
    assert incident.miopen.startswith("normal find (MIOPEN_FIND_MODE unset: DYNAMIC_HYBRID")
    assert incident.miopen.endswith("; no kernel search") and incident.to_dict()["miopen"] == incident.miopen


@pytest.mark.parametrize("how", ["inherited", "worker_env", "rung", "benchmark_unknown"])
def test_where_a_search_can_happen_its_lines_are_news(how):
    trust = {"MIOPEN_FIND_MODE": "TRUST_VERIFY"}
    d = {"inherited": lambda: rocm_run(inherited=trust),
         "worker_env": lambda: rocm_run(worker={"env": trust}),
         "rung": lambda: rocm_run(ladder={"rungs": [{"env": trust}]}),  # at rung 1
         "benchmark_unknown": lambda: rocm_run(worker=COMMAND)}[how]()
    if how == "rung":
        d.s.rung = 1
    entered = d.t
    search(d, 50.0, SEARCH[:4])  # 200 s of lines 50 s apart: past the 60 s bound, kept alive
    assert d.s.state == core.State.STARTING and d.t - entered > 3 * 60
    actions = d.at(d.t + 60.01)(core.Tick())
    incident = actions[-1].incident
    assert incident.kernel_search.startswith("MIOpen search")
    if how == "benchmark_unknown":  # a script sets its own torch flags
        assert incident.miopen is None
    else:
        assert incident.miopen.startswith("normal find (MIOPEN_FIND_MODE=TRUST_VERIFY: TRUST_VERIFY")
        assert incident.miopen.endswith("a kernel search can happen")


def test_torch_2_8s_immediate_mode_searches_nothing_whatever_the_variables():
    d = rocm_run(torch=(2, 8), worker={"env": {"MIOPEN_FIND_MODE": "TRUST_VERIFY", "MIOPEN_FIND_ENFORCE": "3"}})
    entered = d.t
    d.at(d.t + 30)(SEARCH[1])
    assert d.s.watch.deadline.at == entered + 60
    incident = d.at(entered + 60.01)(core.Tick())[-1].incident
    assert incident.miopen.startswith("immediate (no find")
    # [train] deterministic = false on torch 2.8: a find, which TRUST_VERIFY lets tune
    d = rocm_run(torch=(2, 8), train={"deterministic": False, "workers": 8, "epochs": 3},
                 worker={"env": {"MIOPEN_FIND_MODE": "TRUST_VERIFY"}})
    entered = d.t
    d.at(d.t + 30)(SEARCH[1])
    assert d.s.watch.deadline.at == entered + 30 + 60
