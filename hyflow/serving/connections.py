"""How long `hyflow serve` keeps a connection that sends no request: uvicorn's HTTP protocol with a deadline for
a request's headers.

uvicorn closes an idle keep-alive connection after `timeout_keep_alive` seconds, but only after a response, and
any byte received cancels that timer: a client that connects and sends nothing, or sends its headers a byte at a
time, would hold its connection (and a file descriptor) forever. `header_deadline_protocol(seconds)` closes a
connection whose next request's headers are not complete `seconds` after it opened or after its last response.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol


def header_deadline_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's own HTTP protocol (httptools when installed, else h11), whose connections must complete each
    request's headers within `header_timeout_s` seconds; pass it as `uvicorn.Config(http=...)`."""

    class HeaderDeadlineProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]
        _deadline: asyncio.TimerHandle | None = None
        _waiting_since: Any = None  # the cycle (request) that was current when the deadline was set

        def _arm(self) -> None:
            self._disarm()
            self._waiting_since = self.cycle
            self._deadline = self.loop.call_later(header_timeout_s, self._close_if_still_waiting)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _close_if_still_waiting(self) -> None:
            self._deadline = None
            if self.cycle is self._waiting_since and not self.transport.is_closing():
                self.transport.close()  # no new request began: no answer is owed

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._deadline is not None and self.cycle is not self._waiting_since:
                self._disarm()  # a request's headers are complete

        def on_response_complete(self) -> None:
            super().on_response_complete()
            idle = self.cycle is None or self.cycle.response_complete  # no pipelined request already started
            if idle and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadlineProtocol
