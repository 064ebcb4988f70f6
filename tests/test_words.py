"""The words a test holds: the README a newcomer reads in 15 minutes, a design doc with no figures and no history,
code whose comments carry no device timings and no commit hashes (those belong in bench/RESULTS.md), and benches
that run as modules of the ``bench`` package only.

What counts, said once:

- *Prose* is a comment (consecutive comment lines are one block) or a string standing alone as a statement (a module,
  class or function docstring, or an attribute's), read with ``tokenize`` and ``ast``, never from code strings.
- A *commit hash* is a word of 7 to 40 hex digits with at least one digit and one letter a-f, not part of a longer
  token (so not ``0x7fbb5160``, not a version's ``6.2.41133-dd7f95766``, not a path or a URL).
- A *device timing* is a sentence of prose (split at a period, a space and a capital) that holds both a quantity (a
  number with a unit of time or speed: ns, us, ms, s, min, h, it/s, s/it, or a ratio such as ``1.40x``) and a sign
  that it was measured: a machine (a GPU model such as H100, MI300X or RX 5700, "the VM", "the device machine", "the
  CPU demo", "on CI", "on a CPU") or a verb of measuring ("took", "costs about", "measured on"). A bound in code ("at
  least 3 s", "a 3 s timeout", "a GPU kernel that never ends is found in about 3 s") shows neither and passes; a
  figure that needs its machine or its run to mean anything is a measurement.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

README_MAX_LINES = 250
DESIGN_MAX_LINES = 350
README_HEADLINES_MAX = 5

COMMIT_HASH = re.compile(r"(?<![\w.:/\-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w.:/\-])")
QUANTITY = re.compile(r"\b\d+(?:[.,]\d+)?(?:\s?(?:-|to)\s?\d+(?:\.\d+)?)?\s?(?:ns|us|µs|ms|s|sec|seconds?|min|minutes?"
                      r"|h|hours?|it/s|s/it)\b|\b\d+\.\d+x\b")
MEASURED = re.compile(r"\b(?:[HABV]100|H200|A10G?|L4|T4|GH200|B200|MI\d{3}X?|RX ?\d{4}(?: ?XTX?)?|RTX ?\d{4})\b"
                      r"|\bVM\b|\bdevice machine\b|\bCPU demo\b|\bon CI\b|\bon (?:a|an|the|this) (?:CPU|GPU|laptop)\b"
                      r"|\btook\b|\bcosts? about\b|\bmeasured (?:on|at|with|here)\b")
SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z])")


def prose(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each comment block and each standalone string of a Python file."""
    source = path.read_text()
    blocks: list[tuple[int, str]] = []
    last = -2
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line, text = token.start[0], token.string.lstrip("#").strip()
        if line == last + 1 and blocks:
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + " " + text)
        else:
            blocks.append((line, text))
        last = line
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            blocks.append((node.lineno, " ".join(node.value.value.split())))
    return blocks


def device_timings(text: str) -> list[str]:
    return [s for s in SENTENCE_END.split(text) if QUANTITY.search(s) and MEASURED.search(s)]


def offenders(package: Path, root: Path = ROOT) -> list[str]:
    """``file:line: what`` for every commit hash and device timing in the prose of a package's modules."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(root)
        for line, text in prose(path):
            found += [f"{where}:{line}: commit hash {h}" for h in COMMIT_HASH.findall(text)]
            found += [f"{where}:{line}: device timing: {s[:160]}" for s in device_timings(text)]
    return found


def test_the_readme_is_read_in_fifteen_minutes():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, "README.md: move detail to docs/behaviour.md"
    measured = readme.split("\n## Measured", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in measured.splitlines() if r.startswith("| ") and not r.startswith("| what ")]
    assert len(rows) <= README_HEADLINES_MAX, "README.md: the headline figures are 5; the rest go to bench/RESULTS.md"


def test_the_design_doc_is_short_and_holds_no_figures_and_no_commits():
    design = (ROOT / "docs" / "design.md").read_text()
    assert len(design.splitlines()) <= DESIGN_MAX_LINES
    text = " ".join(design.split())
    assert COMMIT_HASH.findall(text) == []
    assert device_timings(text) == [], "figures belong in bench/RESULTS.md"


def test_the_worker_prose_holds_no_device_timings_and_no_commit_hashes():
    assert offenders(ROOT / "worker") == []


def test_the_supervisor_prose_holds_no_device_timings_and_no_commit_hashes():
    assert offenders(ROOT / "supervisor") == []


def test_the_configuration_keys_help_holds_no_device_timings_and_no_commit_hashes():
    """A key's help is prose too: docs/configuration.md is written from it."""
    from supervisor.config import KEYS, RUNG_SETTINGS, SECTION_DOCS

    docs = [(k.where, k.doc or "") for k in [*KEYS, *RUNG_SETTINGS]] + list(SECTION_DOCS.items())
    found = [(where, COMMIT_HASH.findall(doc), device_timings(doc)) for where, doc in docs]
    assert [f for f in found if f[1] or f[2]] == [], "figures belong in bench/RESULTS.md"


def test_no_bench_edits_its_import_path():
    """Benches run as ``python -m bench.NAME`` from the checkout; a worker script one writes elsewhere gets the checkout
    on PYTHONPATH from ``bench.harness.checkout_env``, never by editing sys.path itself."""
    assert [p.name for p in sorted((ROOT / "bench").glob("*.py")) if "sys.path" in p.read_text()] == []


def test_the_rules_catch_what_they_name_and_pass_bounds():
    """The rules above on the lines they were written against, and on constants they must leave alone."""
    assert device_timings("a synchronous save held the loop 375 ms for YOLOv8n and 3.9 s for YOLOv8x on an H100")
    assert device_timings("(the validator's metrics import it: 0.5 s of a launch on an H100)")
    assert device_timings("init_seeds imports it: 1.9 s on a CPU")
    assert device_timings("34.2 ms with this fallback against cuDNN's 26.5 on the H200")
    assert device_timings("the fallback is 1.40x native on an RX 7900 XTX")
    assert device_timings("validation's set-up and the save hold one place for seconds (3.1 s on CI after a resume)")
    assert device_timings("The copy costs about 0.7 ms per MB, once per checkpoint interval.")
    assert COMMIT_HASH.findall("The state file's per-rung maps (code at 44465a3 and earlier)") == ["44465a3"]
    for bound in ("at least 3 s instead while every process does nothing at all",
                  "check_font probes the URL with a 3 s timeout", "the default sampling interval (5 s) of the GPU",
                  "WatchdogSec=30s on the host", "a GPU kernel that never ends is found in about 3 s"):
        assert device_timings(bound) == [], bound
    for word in ("0x7fbb51601000", "6.2.41133-dd7f95766", "deadbeef", "0000:65:00.0", "1234567", "decaded"):
        assert COMMIT_HASH.findall(word) == [], word
