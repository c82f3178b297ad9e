"""docs/configuration.md is generated from the config dataclasses and must match a fresh generation."""

from __future__ import annotations

from hyflow.config.reference import field_comments, iter_key_docs, render_reference

from .markdown import DOCS


def test_the_committed_configuration_reference_equals_a_fresh_generation():
    committed = (DOCS / "configuration.md").read_text()
    assert committed == render_reference(), (
        "docs/configuration.md is out of date with hyflow/config/. Regenerate it: "
        "python -m hyflow.config.reference > docs/configuration.md"
    )


def test_every_config_key_has_a_meaning():
    missing = [row.key for row in iter_key_docs() if not row.meaning]
    assert not missing, (
        f"config keys without a meaning: {missing}. Add a comment at the end of the field's line in hyflow/config/ "
        "(or an entry in hyflow/config/field_meanings.yaml), then regenerate docs/configuration.md."
    )


def test_field_comments_are_read_from_the_end_of_the_line_or_the_lines_above():
    from dataclasses import dataclass

    @dataclass
    class Example:
        plain: int = 1
        inline: int = 2  # the inline meaning
        # the meaning above,
        # on two lines
        above: int = 3
        linted: str | None = None

    assert field_comments(Example) == {"inline": "the inline meaning", "above": "the meaning above, on two lines"}


def test_every_key_of_the_config_appears_in_the_reference():
    page = render_reference()
    leaves = [row.key.rpartition(".")[2] for row in iter_key_docs() if not row.is_section]
    assert all(f"| `{name}` |" in page for name in leaves)
