"""MIOpen's kernel search read from a worker's output (attempt/search_lines.py), on its lines in the sources' formats
(tests/fixtures/miopen/search.log): each line of a search is news with the count it says is left; MIOpen's other
warnings, the search's score line and a training's own lines are not."""

from pathlib import Path

from supervisor.attempt import search_lines

FIXTURE = Path(__file__).parent.parent / "fixtures" / "miopen" / "search.log"


def test_each_search_line_is_news_with_the_runs_it_says_are_left_and_no_other_line_is():
    lines = [line for line in FIXTURE.read_text().splitlines() if not line.startswith("#")]
    news = [(n.library, n.runs_left) if (n := search_lines.read(line)) else None for line in lines]
    assert news == [None,  # the missing kernel database: a signature (signatures.py), not a search
                    ("MIOpen", None), ("MIOpen", 287), ("MIOpen", 262), ("MIOpen", 236), ("MIOpen", 211),
                    ("MIOpen", None), ("MIOpen", 53),
                    ("MIOpen", 390), ("MIOpen", 288), ("MIOpen", 183), ("MIOpen", 81), ("MIOpen", 0),
                    None,  # the score after Done
                    None, None]  # Ultralytics' own lines
    assert search_lines.read(lines[2]).line == lines[2]
