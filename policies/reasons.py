"""IBM MQ reason codes (MQRC) used by jms-bridge, as data.

Names and numbers are IBM MQ's; the bridge reports them exactly so that operators can look
them up in IBM's documentation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reason:
    name: str
    code: int

    def __str__(self) -> str:
        return f"{self.name} ({self.code})"


MQRC_NONE = Reason("MQRC_NONE", 0)
# The broker connection went away under a connected client.
MQRC_CONNECTION_BROKEN = Reason("MQRC_CONNECTION_BROKEN", 2009)
MQRC_EXPIRY_ERROR = Reason("MQRC_EXPIRY_ERROR", 2013)
MQRC_MSG_TOO_BIG_FOR_Q = Reason("MQRC_MSG_TOO_BIG_FOR_Q", 2030)
MQRC_NOT_AUTHORIZED = Reason("MQRC_NOT_AUTHORIZED", 2035)
# A queue another connection holds exclusively (IBM MQ: opened with conflicting options).
MQRC_OBJECT_IN_USE = Reason("MQRC_OBJECT_IN_USE", 2042)
MQRC_OPTIONS_ERROR = Reason("MQRC_OPTIONS_ERROR", 2046)
MQRC_PUT_INHIBITED = Reason("MQRC_PUT_INHIBITED", 2051)
MQRC_Q_FULL = Reason("MQRC_Q_FULL", 2053)
MQRC_UNKNOWN_OBJECT_NAME = Reason("MQRC_UNKNOWN_OBJECT_NAME", 2085)
MQRC_UNEXPECTED_ERROR = Reason("MQRC_UNEXPECTED_ERROR", 2195)
MQRC_FUNCTION_NOT_SUPPORTED = Reason("MQRC_FUNCTION_NOT_SUPPORTED", 2298)
MQRC_BACKOUT_THRESHOLD_REACHED = Reason("MQRC_BACKOUT_THRESHOLD_REACHED", 2362)
MQRC_PROPERTY_VALUE_BAD = Reason("MQRC_PROPERTY_VALUE_BAD", 2473)
MQRC_PUBLICATION_FAILURE = Reason("MQRC_PUBLICATION_FAILURE", 2502)
# A client's CONNECT could not be carried to the broker: it does not answer.
MQRC_HOST_NOT_AVAILABLE = Reason("MQRC_HOST_NOT_AVAILABLE", 2538)
# Feedback code of a report or dead letter whose message expired (MQFB_EXPIRATION).
MQFB_EXPIRATION = Reason("MQFB_EXPIRATION", 258)

BY_NAME: dict[str, Reason] = {
    r.name: r for r in globals().copy().values() if isinstance(r, Reason)
}
BY_CODE: dict[int, Reason] = {r.code: r for r in BY_NAME.values()}
