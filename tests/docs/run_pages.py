"""Run the runnable blocks of several docs pages in this one process (imports are paid once), page by page.

    python tests/docs/run_pages.py PLAN.json RESULTS.json

PLAN.json lists pages: `{"page", "workdir", "blocks": [{"where", "path", "line", "lang", "code", "file"}, ...]}`.
Each page runs in its own working folder with its own namespace: `file` blocks are written, python blocks are
executed in order in the page's namespace, bash blocks run in a `bash -euo pipefail` subprocess. The first failing
block ends its page; the next page still runs. RESULTS.json maps each page to `{"ok", "error", "seconds"}`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from hyflow.controller.worker import DIST_ENV_KEYS


class BlockFailed(Exception):
    """A block raised or exited non-zero; the message says which block and why."""


def run_block(block: dict, namespace: dict) -> None:
    """Write, execute or shell out one block in the current working folder."""
    if block.get("file"):
        target = Path(block["file"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block["code"])
        return
    if block["lang"] == "python":
        try:
            # Blank lines in front, so that tracebacks show the line numbers of the Markdown file.
            source = "\n" * block["line"] + block["code"]
            exec(compile(source, block["path"], "exec"), namespace)
        except BaseException as error:  # SystemExit from a CLI entry point included
            raise BlockFailed(f"{block['where']} raised:\n{traceback.format_exc()}") from error
        return
    # As in a fresh shell: without the distributed env (MASTER_PORT, ...) that a python block's worker group wrote
    # into this process, whose port the process still holds.
    env = {key: value for key, value in os.environ.items() if key not in DIST_ENV_KEYS}
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block["code"]], capture_output=True, text=True, timeout=300, env=env
    )
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        raise BlockFailed(
            f"{block['where']} (bash) exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )


def run_page(page: dict) -> dict:
    """Run one page's blocks in its folder; the result says whether all of them passed."""
    start = time.perf_counter()
    os.chdir(page["workdir"])
    namespace: dict = {"__name__": "__main__"}
    try:
        for block in page["blocks"]:
            run_block(block, namespace)
    except BlockFailed as error:
        return {"ok": False, "error": str(error), "seconds": time.perf_counter() - start}
    return {"ok": True, "error": "", "seconds": time.perf_counter() - start}


def main(plan_path: str, results_path: str) -> int:
    sys.path[0] = ""  # the page's working folder (cwd), so snippets import the files they wrote, not tests/docs
    plan = json.loads(Path(plan_path).read_text())
    results = {}
    for page in plan:
        print(f"=== {page['page']}", flush=True)
        results[page["page"]] = run_page(page)
        Path(results_path).write_text(json.dumps(results))  # after each page, so a timeout keeps what finished
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
