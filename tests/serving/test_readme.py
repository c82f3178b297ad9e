"""The README's serving snippet runs as written against a live server (only the port is the test's own)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def readme_serving_snippet() -> str:
    section = README.read_text().split("## Serving", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return code


def test_the_readme_serving_snippet_runs_against_the_server(server, capsys):
    code = readme_serving_snippet()
    assert "127.0.0.1:8000/v1" in code
    exec(compile(code.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}"), str(README), "exec"), {})
    assert capsys.readouterr().out.strip()
