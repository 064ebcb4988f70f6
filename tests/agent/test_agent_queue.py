"""The agent decides one event at a time: an event that carrying out a decision's actions brings (the tree's
evidence before a kill, the kill's outcome, a spawn) waits until every action of that decision is done."""

from supervisor import agent as agent_module
from supervisor.config import load


def test_an_event_sent_while_actions_run_is_decided_after_they_all_finish(tmp_path, monkeypatch):
    agent = agent_module.Agent(load(None, state_dir=tmp_path / "state"))
    story: list[str] = []

    def decide(s, event, now):
        story.append(f"decide {event}")
        return s, {"first": ["kill", "spawn"], "evidence": ["log"]}.get(event, [])

    def execute(action):
        story.append(f"start {action}")
        if action == "kill":
            agent.handle("evidence")  # as _kill sends IncidentEnriched, then TreeKilled
            agent.handle("killed")
        story.append(f"end {action}")

    monkeypatch.setattr(agent_module.decision, "decide", decide)
    monkeypatch.setattr(agent, "_execute", execute)
    monkeypatch.setattr(agent, "_write_state", lambda force, final=False: None)
    agent.handle("first")
    assert story == ["decide first", "start kill", "end kill", "start spawn", "end spawn",
                     "decide evidence", "start log", "end log", "decide killed"]
    assert not agent.pending
    agent.handle("later")  # the queue is free again: a later event is decided at once
    assert story[-1] == "decide later"
