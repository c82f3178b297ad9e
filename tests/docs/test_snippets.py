"""Every code block of the docs marked `<!-- run -->` runs on CPU, so the docs cannot rot.

Pages without Ray run together in one subprocess (one import of torch for all of them), each in its own temporary
folder and namespace; pages marked `<!-- run: ray -->` run in a subprocess of their own. Each page is one test, so a
failure names the page and the block (file:line) with its traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .markdown import REPO, RUNNABLE_LANGS, Block, pages, runnable_blocks

RUNNER = Path(__file__).with_name("run_pages.py")


def _page_needs_ray(blocks: list[Block]) -> bool:
    return any("ray" in b.options for b in blocks)


RUNNABLE = {page: runnable_blocks(page) for page in pages()}
RUNNABLE = {page: found for page, found in RUNNABLE.items() if any(b.run for b in found)}
LOCAL_PAGES = [p for p, found in RUNNABLE.items() if not _page_needs_ray(found)]
RAY_PAGES = [p for p, found in RUNNABLE.items() if _page_needs_ray(found)]


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


def run_pages(page_list: list[Path], tmp_root: Path, timeout_s: float) -> dict[str, dict]:
    """Run the pages' blocks in one subprocess; {page: {"ok", "error", "seconds"}}."""
    plan = []
    for page in page_list:
        workdir = tmp_root / _name(page).replace("/", "_").removesuffix(".md")
        workdir.mkdir(parents=True)
        blocks = [
            {"where": b.where, "path": _name(page), "line": b.line, "lang": b.lang, "code": b.code, "file": b.file}
            for b in RUNNABLE[page]
        ]
        plan.append({"page": _name(page), "workdir": str(workdir), "blocks": blocks})
    plan_path, results_path = tmp_root / "plan.json", tmp_root / "results.json"
    plan_path.write_text(json.dumps(plan))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)  # a page starts its own local Ray cluster, never one left by another test
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a process group of an earlier test in this process may still hold that port
    command = [sys.executable, str(RUNNER), str(plan_path), str(results_path)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
        stopped = f"the runner stopped before this page:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    except subprocess.TimeoutExpired:
        stopped = f"the pages took more than {timeout_s:g} s together; this one had not finished"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for page in page_list:
        results.setdefault(_name(page), {"ok": False, "error": stopped})
    return results


@pytest.fixture(scope="module")
def local_results(request, tmp_path_factory) -> dict[str, dict]:
    """Results of the local pages whose tests were selected (`-k` picks pages), run in one subprocess."""
    selected = [
        item.callspec.params["page"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_the_runnable_blocks_of_the_page_run"
    ]
    return run_pages(selected, tmp_path_factory.mktemp("docs_local"), timeout_s=540)


def test_runnable_blocks_are_python_or_bash():
    wrong = [b.where for found in RUNNABLE.values() for b in found if b.run and b.lang not in RUNNABLE_LANGS]
    assert not wrong, f"blocks marked <!-- run --> must be python or bash: {wrong}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", LOCAL_PAGES, ids=_name)
def test_the_runnable_blocks_of_the_page_run(page: Path, local_results: dict[str, dict]):
    result = local_results[_name(page)]
    assert result["ok"], result["error"]


@pytest.mark.ray
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", RAY_PAGES, ids=_name)
def test_the_runnable_blocks_of_the_ray_page_run(page: Path, tmp_path: Path):
    pytest.importorskip("ray")
    result = run_pages([page], tmp_path, timeout_s=540)[_name(page)]
    assert result["ok"], result["error"]
