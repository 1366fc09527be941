"""The staging engine's releaser: the move that puts a due staged copy to its target, and for a
copy of a scheduler series, the one that stages the series' next copy in its place."""

from __future__ import annotations

from adapters.base import Held, Message, Move, StagingBroker
from bridge.staging import series
from bridge.staging.engine_settling import Settler
from bridge.staging.engine_work import Destinations, Work, WorkKind
from bridge.staging.envelope import DUE, Staged, released_headers
from bridge.staging.levels import Layout
from bridge.staging.series import SeriesMemory
from policies.errors import PutRefused


class Releaser:
    """Builds the release moves of the messages the engine holds, as they come due or an
    operator's order releases them."""

    def __init__(self, broker: StagingBroker, layout: Layout, *, destinations: Destinations,
                 series: SeriesMemory, settler: Settler) -> None:
        """``series``: the copies of series released (shared with the settler, which
        remembers those continued); ``settler`` takes a series copy whose put is refused."""
        self.broker = broker
        self.layout = layout
        self._dest = destinations
        self._series = series
        self._settler = settler

    def released(
        self, held: Held, staged: Staged, now_ms: int, *, go_on: bool = True
    ) -> Work:
        """The release of a held staged copy; one of a scheduler series stages the next copy
        too, unless not ``go_on`` (released on an operator's order: the series ends)."""
        headers = released_headers(held.message.headers, self.broker.format, now_ms=now_ms)
        if series.is_series(held.message.headers):
            if go_on:
                return self._released_copy(held, staged, headers, now_ms)
            headers = series.as_copy(headers, held.message.headers,
                                     self.broker.format.message_id_header)
        move = Move(held, staged.target, Message(headers, held.message.body),
                    mandatory=staged.mandatory)
        return Work(WorkKind.RELEASE, move, staged)

    def _released_copy(
        self, held: Held, staged: Staged, headers: dict[str, str], now_ms: int
    ) -> Work:
        """A copy of a scheduler series: put to its target (confirmed) now, then its staged
        copy is replaced by the next one (or acknowledged, the series over) in the settle.
        A crash before that settle puts this copy again (it was in flight) and may stage the
        next one twice: both copies are one occurrence (``series.key_of``), and once one of
        them is settled here the other is dropped when it is met."""
        staged_headers_ = held.message.headers
        key = series.key_of(staged_headers_)
        done = self._series.copies.get(key)
        if done or key in self._series.batch:  # its next copy is staged (or being staged)
            return Work(WorkKind.DROP, Move(held), staged)
        fmt = self.broker.format
        message = Message(series.as_copy(headers, staged_headers_, fmt.message_id_header),
                          held.message.body)
        if done is None:
            try:
                self.broker.publish(staged.target, message, mandatory=staged.mandatory)
            except PutRefused as refused:
                # As any release refused: message-retry or the failure path; the series goes
                # on from the copy that is eventually released.
                return self._settler.refused(Work(WorkKind.RELEASE, Move(
                    held, staged.target, message, mandatory=staged.mandatory), staged),
                    refused, now_ms)
            self._series.remember(key, False)
        self._series.batch.add(key)
        following = series.next_copy(staged_headers_, now_ms)
        if following is None:
            return Work(WorkKind.SERIES, Move(held), staged, series_key=key)
        due = int(following[DUE])
        queue = self.layout.queue_for(due - now_ms)
        move = Move(held, self._dest.of(queue), Message(following, held.message.body))
        return Work(WorkKind.SERIES, move, staged, queue=queue, series_key=key)
