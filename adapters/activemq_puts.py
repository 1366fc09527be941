"""Putting on ActiveMQ: ``settle`` (SENDs with receipts, pipelined, then the ACKs) and ``publish``.

What this relies on, checked against ActiveMQ 5.17 (tests/integration/test_adapters.py):
- A SEND without ``content-length`` makes a TextMessage, one with it a BytesMessage, and only a
  BytesMessage's MESSAGE has ``content-length``. ``settle`` gives a replacement the kind of the
  held message it replaces (text when its body is UTF-8 without NUL); ``publish`` sends bytes.
- An ERROR names the ``receipt-id`` of the frame that failed and leaves the connection open.
  ``settle`` SENDs with receipts and ACKs only what went through: a SEND refused that way (e.g.
  to a ``/remote-temp-queue/`` whose connection is gone: DestinationDoesNotExistException) leaves
  its message held by us and raises PutRefused, the other moves done. Many SENDs at once go in
  a transaction instead (``TX_MIN``): a SEND refused inside one is answered with an ERROR that
  names no receipt and marks the transaction rollback-only, so its COMMIT is refused ("COMMIT
  FAILED: Transaction marked rollback only"), nothing of it is stored, the transaction is gone
  (an ABORT of it is "Invalid transaction id") and the connection stays open; the SENDs then go
  again with receipts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from adapters.activemq_connection import Connection, activemq_reason
from adapters.activemq_transport import StompConnection
from adapters.base import PER_DELIVERY, Message, Move
from policies.errors import BrokerUnavailable, PutRefused
from policies.reasons import MQRC_UNKNOWN_OBJECT_NAME

# Never copied from a Message onto a SEND: the adapter sets its own.
FRAME_HEADERS = PER_DELIVERY | {"receipt", "transaction"}

# /remote-temp-queue/<id>: another connection's temporary queue (a reply-to), as ActiveMQ names it.
DESTINATION_PREFIXES = ("/queue/", "/topic/", "/remote-temp-queue/", "/remote-temp-topic/")
# A settle with this many SENDs or more puts them in one transaction (a burst's releases):
# ActiveMQ stores persistent SENDs that each want a receipt one by one, and a transaction's
# all at once, several times faster (docs/benchmarks.md, "Measurements behind design choices").
# Fewer go with receipts: a COMMIT costs milliseconds under load, which a trickle of releases
# would wait for (see ``settle``).
TX_MIN = 50
# How long the ERROR (naming no receipt) of a SEND refused in a refused transaction is waited
# for after its SEND was refused again with a receipt: not counted as a broker failure then.
ECHO_WAIT_S = 60.0


def valid_destination(destination: str) -> bool:
    return destination.startswith(DESTINATION_PREFIXES) and destination not in DESTINATION_PREFIXES


def _check_destination(destination: str) -> None:
    if not valid_destination(destination):
        raise ValueError(f"unsupported destination {destination!r}")


def _is_text(body: bytes) -> bool:
    """Whether a body can travel as a TextMessage: UTF-8, no NUL (no content-length)."""
    if b"\0" in body:
        return False
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class Puts(Connection):
    """``settle`` and ``publish`` of ``adapters.activemq.ActiveMQ``."""

    _peek_wait: float

    def settle(self, moves: Sequence[Move]) -> None:
        """Each SEND with a receipt, pipelined, or, from ``TX_MIN`` SENDs, all in one transaction
        committed with a receipt; when they are stored, the ACK of every move whose SEND
        went through (one receipt, on the last, checked by the next settle). The ACKs are not
        in the transaction: ActiveMQ commits transacted STOMP ACKs several times slower
        (docs/benchmarks.md, "Measurements behind design choices"). Not every
        settle in a transaction: a COMMIT on ActiveMQ 5.17 took about 8 ms under load, and
        at 1,000 releases a second (settles of a few) that was most of the engine's time
        (p99 lateness 3.4-3.7 s with transactions, 44 ms without). A COMMIT that ActiveMQ
        refuses (a SEND in it was refused, so it rolled back) is followed by the same SENDs
        with receipts. A crash between a SEND and its ACK puts the message twice, never
        loses it. Any failure but a refused SEND closes the connection, so the broker
        returns what was held; a refused SEND raises PutRefused with the other moves done
        (``also_done``)."""
        if not moves:
            return
        conn = self._live()
        for move in moves:
            token = self._token(move.held)
            if token.generation != self._generation:
                raise BrokerUnavailable(
                    f"{self._where()}: a held message of {move.held.queue} belongs to a lost "
                    "connection and is back on its queue"
                )
            if token.peeked and self._heads.get(move.held.queue) is not move.held:
                raise ValueError(f"a head of {move.held.queue} that was put back is not held")
            if move.destination is not None and move.message is None:
                raise ValueError("a move with a destination needs a message")
        for i, move in enumerate(moves):
            if move.destination is not None and not valid_destination(move.destination):
                if i:
                    self.settle(moves[:i])
                raise PutRefused(i, MQRC_UNKNOWN_OBJECT_NAME,
                                 "not a destination ActiveMQ's STOMP can send to",
                                 move.destination)
        sending = [i for i, move in enumerate(moves)
                   if move.destination is not None and move.message is not None]
        acks, self._acks = self._acks, None
        errors = acks[1] if acks else len(self._listener.errors)
        try:
            refused: dict[int, str] | None = None
            retried = False
            if len(sending) >= TX_MIN:
                refused = self._put_in_transaction(conn, moves, sending, acks, errors)
                acks = None  # waited for with the COMMIT
                retried = refused is None
            if refused is None:
                refused = self._put_with_receipts(conn, moves, sending, acks, errors,
                                                  echoes=retried)
            done = [i for i in range(len(moves)) if i not in refused]
            if done:
                # One receipt, on the last ACK, and not waited for: an ACK that is lost only
                # means the message comes again, and the ACKs' round trip was a third of a
                # settle's time. The broker answers frames in order, so the next settle finds
                # this receipt answered with its SENDs', and an ACK it refused (no receipt of
                # its own) among the ERRORs by then.
                last = self._receipt()
                errors = len(self._listener.errors)
                with self._translate(), conn.transport.corked():
                    for i in done:
                        extra = {"receipt": last} if i == done[-1] else {}
                        conn.ack(self._token(moves[i].held).ack_id, **extra)
                self._acks = (last, errors)
        except BrokerUnavailable:
            self.close()
            raise
        next_head = time.monotonic() + self._peek_wait
        for i in done:
            held = moves[i].held
            if self._heads.get(held.queue) is held:
                del self._heads[held.queue]
                self._expect[held.queue] = next_head
        if refused:
            first = min(refused)
            text = refused[first]
            self._log.debug("put refused", destination=moves[first].destination, error=text)
            raise PutRefused(first, activemq_reason(text), text, moves[first].destination or "",
                             also_done=tuple(i for i in done if i > first))

    def _put_in_transaction(self, conn: StompConnection, moves: Sequence[Move],
                            sending: list[int], acks: tuple[str, int] | None,
                            errors: int) -> dict[int, str] | None:
        """The SENDs in one transaction, committed with a receipt: {} when it is, None when
        ActiveMQ refused the COMMIT (a SEND in it was refused: the transaction is rolled back,
        nothing of it stored, and the SENDs go again with receipts, which name the one)."""
        tx, commit = self._receipt(), self._receipt()
        with self._translate(), conn.transport.corked():
            conn.begin(transaction=tx)
            for i in sending:
                move = moves[i]
                assert move.destination is not None and move.message is not None
                self._send(conn, move.destination, move.message,
                           text=self._token(move.held).text, transaction=tx)
            conn.commit(transaction=tx, receipt=commit)
        failures = self._answers([commit], acks)
        if commit in failures:
            self._log.debug("transaction refused, putting one by one", error=failures[commit])
            return None
        self._no_new_errors(errors)
        return {}

    def _put_with_receipts(self, conn: StompConnection, moves: Sequence[Move],
                           sending: list[int], acks: tuple[str, int] | None,
                           errors: int, *, echoes: bool = False) -> dict[int, str]:
        """Each SEND with a receipt, pipelined: the refused ones' texts, by move. ``echoes``:
        the same SENDs were refused in a transaction first, where a refused SEND's ERROR
        names no receipt and may come before or after the COMMIT's (ActiveMQ answers a
        transaction's frames asynchronously: both were seen): one such ERROR of each
        refusal's text is not counted, whenever it comes (within ECHO_WAIT_S)."""
        receipts: list[str] = []
        sends: dict[str, int] = {}  # a SEND's receipt -> its move
        with self._translate(), conn.transport.corked():
            for i in sending:
                move = moves[i]
                assert move.destination is not None and move.message is not None
                receipts.append(self._receipt())
                sends[receipts[-1]] = i
                self._send(conn, move.destination, move.message,
                           text=self._token(move.held).text, receipt=receipts[-1])
        failures = self._answers(receipts, acks)
        if echoes:
            new = self._listener.forgive(errors, failures.values(),
                                         time.monotonic() + ECHO_WAIT_S)
            if new:
                raise BrokerUnavailable(f"{self._where()}: settle: {new[-1]}")
        else:
            self._no_new_errors(errors)
        return {sends[r]: text for r, text in failures.items()}

    def _answers(self, receipts: list[str], acks: tuple[str, int] | None) -> dict[str, str]:
        """Wait for ``receipts`` and the last settle's ACK receipt: the ERRORs' texts by
        receipt; BrokerUnavailable if the broker refused an ACK."""
        failures = self._await_all([*receipts, *acks[:1]] if acks else receipts, "settle")
        if acks and acks[0] in failures:
            raise BrokerUnavailable(f"{self._where()}: ACK: {failures[acks[0]]}")
        return failures

    def _no_new_errors(self, errors: int) -> None:
        """BrokerUnavailable when an ERROR naming no receipt came since there were ``errors``."""
        if len(self._listener.errors) > errors:
            raise BrokerUnavailable(f"{self._where()}: settle: {self._listener.errors[-1]}")

    def _confirm_acks(self) -> None:
        """Wait for the receipt on the last settle's ACKs (settle itself leaves that to the
        next settle); BrokerUnavailable if the broker refused one."""
        acks, self._acks = self._acks, None
        if acks is None:
            return
        try:
            self._await([acks[0]], "ACK")
            if len(self._listener.errors) > acks[1]:
                raise BrokerUnavailable(f"{self._where()}: ACK: {self._listener.errors[-1]}")
        except BrokerUnavailable:
            self.close()
            raise

    def publish(self, destination: str, message: Message, *, mandatory: bool = False) -> None:
        """SEND (a BytesMessage) with a receipt and wait for it; an ERROR for it (the
        connection stays open) is PutRefused."""
        conn = self._live()
        rid = self._receipt()
        with self._translate():
            self._send(conn, destination, message, text=False, receipt=rid)
        failure = self._await_all([rid], f"SEND {destination}").get(rid)
        if failure is not None:
            raise PutRefused(0, activemq_reason(failure), failure, destination)

    def _send(
        self,
        conn: StompConnection,
        destination: str,
        message: Message,
        *,
        text: bool,
        **frame_headers: str,
    ) -> None:
        _check_destination(destination)
        headers = {n: v for n, v in message.headers.items() if n not in FRAME_HEADERS}
        if not (text and _is_text(message.body)):
            headers["content-length"] = str(len(message.body))
        headers.update(frame_headers)
        conn.send(destination, message.body, headers=headers)
