"""analysis/README.md's numeric tables are generated from the committed artefacts, not typed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_tool():
    spec = importlib.util.spec_from_file_location(
        "analysis_readme", ROOT / "scripts" / "analysis_readme.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_block_equals_what_its_source_makes():
    tool = readme_tool()
    text = tool.README.read_text()
    blocks = tool.BLOCK.findall(text)
    sources = [b[1] for b in blocks]
    assert any(s.startswith("calibration ") for s in sources)
    assert any("cosine_vs_wsd" in s and "--markdown" in s for s in sources)
    assert any("k2_vs_k3" in s and "--markdown" in s for s in sources)
    for _header, source, body, _end in blocks:
        assert body == tool.render(source), f"analysis/README.md block `{source}` is stale"


def test_a_changed_number_is_caught():
    tool = readme_tool()
    text = tool.README.read_text()
    header, _source, body, _end = tool.BLOCK.findall(text)[0]
    tampered = text.replace(header + body, header + body.replace("|", "| 9", 1), 1)
    assert tool.regenerate(tampered) != tampered
