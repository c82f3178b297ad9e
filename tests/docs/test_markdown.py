"""The docs' block reader: which fenced blocks run, with which options, and which are written to files."""

from __future__ import annotations

from pathlib import Path

from .markdown import blocks, github_slug


def test_only_blocks_right_after_a_marker_run_or_become_files(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "Intro.\n\n<!-- run -->\n```python\nx = 1\n```\n\n```python\nnot_run()\n```\n\n"
        "<!-- run: ray -->\n```bash\necho hi\n```\n\n<!-- file: tools.yaml -->\n```yaml\ntools: []\n```\n\n"
        "<!-- run -->\n\n```python\nblank_line_breaks_the_marker()\n```\n"
    )
    found = blocks(page)
    assert [(b.lang, b.run, b.options, b.file) for b in found] == [
        ("python", True, set(), None),
        ("python", False, set(), None),
        ("bash", True, {"ray"}, None),
        ("yaml", False, set(), "tools.yaml"),
        ("python", False, set(), None),
    ]
    assert found[0].code == "x = 1\n" and found[0].line == 4


def test_heading_anchors_follow_github():
    assert github_slug("The `actor_rollout_ref.model` section") == "the-actor_rollout_refmodel-section"
    assert github_slug("SFT: `hyflow sft`") == "sft-hyflow-sft"
    assert github_slug("Training with it") == "training-with-it"
