"""The client-error exception of the server: every module that refuses a request raises it, app.py answers it."""

from __future__ import annotations

__all__ = ["BadRequest"]


class BadRequest(ValueError):
    """A client mistake: HTTP 400 (or `status`) with this message."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status
