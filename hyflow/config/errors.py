"""`ConfigError`: every problem found in a config, reported together in one exception."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot run. `problems` holds one message per mistake, each naming the key, the value,
    the rule and the fix."""

    def __init__(self, problems: list[str]) -> None:
        assert problems, "ConfigError needs at least one problem"
        self.problems = list(problems)
        count = len(self.problems)
        header = "1 problem in the config:" if count == 1 else f"{count} problems in the config:"
        super().__init__("\n".join([header, *(f"  - {problem}" for problem in self.problems)]))
