"""Generate the configuration reference (`docs/configuration.md`) from the config dataclasses.

    python -m hyflow.config.reference > docs/configuration.md

The dataclasses in `hyflow.config` are the one source of every key and default; this module only reads them. A
key's meaning is, in order of preference: `field(metadata={"doc": ...})`, the comment at the end of the field's
line in the source (`lr: float = 1e-6  # the peak learning rate`), the comment lines directly above the field, or,
for keys whose source has no comment, the short description in `field_meanings.yaml` beside this file (keyed
by `ClassName.field`). A test (`tests/docs/test_configuration_reference.py`) checks that the committed page equals a
fresh generation and that every key has a meaning, so a new key needs a comment before the docs are regenerated.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from hyflow.config.ppo_trainer import PPOTrainerConfig
from hyflow.config.sft import SFTConfig

__all__ = ["FALLBACK_MEANINGS", "KeyDoc", "field_comments", "iter_key_docs", "main", "render_reference"]

# Meanings of fields whose source line has no comment, keyed by the class that defines the field.
FALLBACK_MEANINGS: dict[str, str] = yaml.safe_load((Path(__file__).parent / "field_meanings.yaml").read_text())


# A comment that only explains a special value ("None: ...", "-1: off") rather than the key itself.
VALUE_NOTE = re.compile(r"^(None|-1|0|True|False|empty|local|async|auto):")


@dataclass(frozen=True)
class KeyDoc:
    """One row of the reference: a dotted key, its type in words, its default, its meaning."""

    key: str
    type: str
    default: str
    meaning: str
    is_section: bool


def _comment_text(token_string: str) -> str:
    return token_string.lstrip("#").strip()


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """Field name → its source comment (end of line, else the comment lines just above) in the class body of `cls`."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    end_of_line: dict[int, str] = {}
    whole_line: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        row, col = token.start
        line = token.line
        target = whole_line if not line[:col].strip() else end_of_line
        target[row] = _comment_text(token.string)
    comments: dict[str, str] = {}
    class_node = ast.parse(source).body[0]
    assert isinstance(class_node, ast.ClassDef)
    for node in class_node.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        text = end_of_line.get(node.end_lineno or node.lineno) or end_of_line.get(node.lineno)
        if text is None:
            above, row = [], node.lineno - 1
            while row in whole_line:
                above.insert(0, whole_line[row])
                row -= 1
            text = " ".join(above) or None
        text = _strip_lint_codes(text or "")
        if text:
            comments[node.target.id] = text
    return comments


def _strip_lint_codes(text: str) -> str:
    """Drop `noqa: XXX (why)` parts: they are for linters, not readers."""
    if text.startswith("noqa"):
        return ""
    return text.split("  # noqa")[0].strip()


def _declaring_classes(cls: type, name: str) -> list[type]:
    """The classes of `cls`'s MRO whose own body declares field `name`, nearest first."""
    return [klass for klass in cls.__mro__ if name in vars(klass).get("__annotations__", {})]


def field_meaning(cls: type, f: dataclasses.Field) -> str:
    """The meaning of one field (see the module docstring for the order of sources).

    A subclass that re-declares a field only to change its default (e.g. SFT's `optim.lr`) keeps the meaning
    written on the base class: the classes of the MRO that declare the field are searched nearest first.
    """
    if f.metadata.get("doc"):
        return str(f.metadata["doc"])
    for owner in _declaring_classes(cls, f.name):
        comment = field_comments(owner).get(f.name, "")
        fallback = FALLBACK_MEANINGS.get(f"{owner.__name__}.{f.name}", "")
        if comment and fallback and VALUE_NOTE.match(comment):
            return f"{fallback}; {comment}"  # the comment only explains a special value: say what the key is first
        if comment or fallback:
            return comment or fallback
    return ""


def describe_hint(hint: Any) -> str:
    """A type annotation as a short string: `int | None`, `"fixed" | "adaptive"`, `list[str]`."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return " | ".join(describe_hint(arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return " | ".join(f'"{arg}"' if isinstance(arg, str) else repr(arg) for arg in typing.get_args(hint))
    if origin in (list, dict, tuple):
        return f"{origin.__name__}[{', '.join(describe_hint(arg) for arg in typing.get_args(hint))}]"
    if hint is type(None):
        return "None"
    if hint is Any:
        return "Any"
    if dataclasses.is_dataclass(hint):  # an entry of a list, e.g. reward_functions: {name, path, weight, ...}
        return "{" + ", ".join(f.name for f in dataclasses.fields(hint)) + "}"
    return getattr(hint, "__name__", str(hint))


def _section_class(hint: Any) -> type | None:
    """The dataclass a field holds (through `X | None`), or None for a leaf."""
    if dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(options) == 1 and dataclasses.is_dataclass(options[0]):
            return options[0]
    return None


def describe_default(f: dataclasses.Field, value: Any) -> str:
    """The default as the command line would write it; inherited and derived fields say where they come from."""
    if "inherit" in f.metadata:
        return f"= `{f.metadata['inherit']}`"  # rendered: = `data.max_prompt_length`
    if f.metadata.get("derived"):
        return "derived"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (list, dict)) and not value:
        return f"`{value!r}`"
    if isinstance(value, (list, dict)):
        return "`" + repr(value).replace("'", '"') + "`"
    return f"`{value!r}`"


def iter_key_docs(cls: type = PPOTrainerConfig, prefix: str = "") -> Iterator[KeyDoc]:
    """Every key of `cls`, depth first, sections included (a section's row comes before its keys)."""
    hints = typing.get_type_hints(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        hint = hints[f.name]
        section = _section_class(hint)
        meaning = field_meaning(cls, f)
        if section is not None:
            yield KeyDoc(key, "section", "", meaning, is_section=True)
            yield from iter_key_docs(section, key)
        else:
            yield KeyDoc(key, describe_hint(hint), describe_default(f, getattr(instance, f.name)), meaning, False)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _section_intro(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _section_classes(cls: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        section = _section_class(hints[f.name])
        if section is not None:
            key = f"{prefix}.{f.name}" if prefix else f.name
            yield key, section
            yield from _section_classes(section, key)


HEADER = """# Configuration reference

<!-- Generated by `python -m hyflow.config.reference > docs/configuration.md`; do not edit by hand. -->

Every key of `python -m hyflow.trainer.main_ppo` (and `hyflow train`), with its type, default and meaning, then
[every key of `hyflow sft`](#sft-hyflow-sft). The PPO keys are verl's, so a verl launch line works as written
(see [Port a verl launch script](howto/port_verl.md)). Set a key on the command line as `section.key=value`, a list
as `key=[a,b]`, and a new entry of a mapping-valued key with a leading `+`
(`+custom_reward_function.reward_kwargs.bonus=0.5`). The whole config is checked when it is loaded: an unknown key
gets the closest valid key as a suggestion, a wrong type or a value outside its choices names the allowed values,
and cross-field rules (batch sizes that must divide, `rollout.n > 1` for group estimators, a critic for `gae`) are
checked before any worker starts.

In the default column, `= other.key` means the key takes that key's value when left unset (verl's `${...}`
interpolation), and `derived` means its section computes it from sibling keys (the meaning says how). Micro-batch
sizes ending in `_per_gpu` are per device and count rows; `ppo_mini_batch_size` counts prompts, each sampled
`rollout.n` times.

Print the config a launch line runs with, every check done and every derived value filled in (engine names as
used, e.g. `rollout.name: hyflow` for verl's `sglang`), with `python -m hyflow.trainer.main_ppo --cfg job
key=value ...`; it starts nothing.

Paths: in every key that holds a path (a name ending in `path`, `_files` or `_dir`, and the tokenizer folders) a
leading `~` is the home folder, on the command line (`data.train_files=~/data/train.parquet`) as from Python.
Quote a value that holds `=`, brackets, commas or spaces (`trainer.experiment_name='a=b'`). The model folders,
data files and config files a run reads are checked at load, and the training files must hold at least one batch
(`data.train_batch_size` rows, after `data.train_max_samples`).

The embedded default: a command line that sets neither `actor_rollout_ref.model.path` nor `data.train_files`
runs `hyflow demo`'s GRPO phase: its tiny model, SFT-trained on the synthetic arith task once and kept under
`$HYFLOW_HOME/embedded_default` (`HYFLOW_HOME` defaults to `~/.cache/hyflow`), with the demo's settings; the
other overrides of the line apply on top. Set one of the two keys and set the other one too.

The backend: `trainer.backend=auto` (the default) is `local` exactly when the run has one process,
`trainer.nnodes * trainer.n_gpus_per_node == 1` (the default: one device, GPU or CPU), and `ray` otherwise; `ray`
needs `pip install hyflow[ray]`. Checkpoints: `trainer.save_freq=N` saves every N steps and after the last one;
`-1` (the default, as in verl) saves none in `hyflow train` (a run then leaves nothing to resume or merge; it says so
when it ends) but saves once at the end in `hyflow sft`, where `0` saves none.
"""

# (title, root dataclass, suffix of its section headings): the PPO config first, then the SFT one.
PARTS: tuple[tuple[str, type, str], ...] = (
    ("PPO and GRPO: `hyflow train`", PPOTrainerConfig, ""),
    ("SFT: `hyflow sft`", SFTConfig, " (sft)"),
)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    return "".join(ch for ch in heading.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def _table(rows: list[KeyDoc], suffix: str) -> list[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for row in rows:
        name = row.key.rpartition(".")[2]
        if row.is_section:
            lines.append(f"| [`{name}`](#{_slug(f'`{row.key}`{suffix}')}) | section | | {_escape(row.meaning)} |")
        else:
            lines.append(f"| `{name}` | `{_escape(row.type)}` | {_escape(row.default)} | {_escape(row.meaning)} |")
    return lines


def _render_part(title: str, root: type, suffix: str) -> list[str]:
    """One root config: a line of links to its top sections, then one table per section."""
    sections = dict(_section_classes(root))
    by_section: dict[str, list[KeyDoc]] = {key: [] for key in sections}
    for row in iter_key_docs(root):
        parent = row.key.rpartition(".")[0]
        if parent in by_section:
            by_section[parent].append(row)
    top = [key for key in sections if "." not in key]
    out = [f"## {title}\n", " · ".join(f"[`{key}`](#{_slug(f'`{key}`{suffix}')})" for key in top) + "\n"]
    for key, cls in sections.items():
        out.append(f"{'#' * min(3 + key.count('.'), 5)} `{key}`{suffix}\n")
        intro = _section_intro(cls)
        if intro:
            out.append(f"{intro}\n")
        out.extend([*_table(by_section[key], suffix), ""])
    return out


def render_reference() -> str:
    """The whole Markdown page: for each root config, one table per section, in the order of the dataclasses."""
    out = [HEADER]
    for title, root, suffix in PARTS:
        out.extend(_render_part(title, root, suffix))
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the reference to stdout."""
    sys.stdout.write(render_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
