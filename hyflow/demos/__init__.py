"""`hyflow demo`: RL post-training end to end on a tiny model built here, one module per task.

    hyflow demo --task arith|countdown|tools|openai_agent|vision      # runner.py: the run, the flags, the table

- `runner.py`: the run every task shares (build the model and data, SFT, GRPO, the summary) and the single-turn
  tasks `arith` and `countdown`; `hyflow demo` is its `main`;
- `tools.py`: the calculator called through `ToolAgentLoop`;
- `openai_agent.py`: the same calculator task, the tool run by an agent program written with the `openai` client;
- `vision.py`: a tiny vision-language model reads pictures of shapes;
- `plot.py`: the live table of each step and the curves (`curves.png` or `curves.csv`).

Each task writes under its own folder, `hyflow-demo/<task>/` unless `--output` names another.
"""
