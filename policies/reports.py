"""IBM MQ report options: which report a message asked for, and what that report looks like.

A JMS application on IBM MQ asks for reports with message properties whose values are the MQI's
MQRO constants (``message.setIntProperty("JMS_IBM_Report_Exception",
MQC.MQRO_EXCEPTION_WITH_DATA)``) and names where they go with its JMSReplyTo. The bridge honours
the ones that concern a message it holds (IBM MQ, "What happens when a message cannot be
delivered": message-retry, then return-to-sender, then the dead-letter queue):

- ``JMS_IBM_Report_Exception`` (MQRO_EXCEPTION, _WITH_DATA, _WITH_FULL_DATA): an exception report
  when the message cannot be put to its target; its feedback is the MQRC reason code;
- ``JMS_IBM_Report_Expiration`` (MQRO_EXPIRATION, _WITH_DATA, _WITH_FULL_DATA): an expiration
  report when it expires while the bridge holds it; feedback MQFB_EXPIRATION (258);
- ``JMS_IBM_Report_Discard_Msg`` (MQRO_DISCARD_MSG): a message that cannot be put is discarded
  instead of being dead-lettered;
- ``JMS_IBM_Report_Pass_Msg_ID`` (MQRO_PASS_MSG_ID) and ``JMS_IBM_Report_Pass_Correl_ID``
  (MQRO_PASS_CORREL_ID): the report's message id is the original's, and its correlation id the
  original's correlation id instead of the original's message id (MQRO_COPY_MSG_ID_TO_CORREL_ID,
  the default).

Not honoured, because the bridge never sees the event: COA and COD (arrival on and delivery from
the target queue happen inside the broker), PAN and NAN (the application's own replies), and
activity reports.

The data of a report: none, the first 100 bytes of the body (``_WITH_DATA``: IBM MQ includes
"the first 100 bytes of the application message data"), or all of it (``_WITH_FULL_DATA``).
Pure: values in, values out; the bridge puts the report.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from policies.properties import whole_number
from policies.reasons import MQFB_EXPIRATION, Reason

__all__ = [
    "CORRELATION_HEADER",
    "DATA_BYTES",
    "FEEDBACK",
    "MQMT_REPORT",
    "MQRO_COA",
    "MQRO_COA_WITH_DATA",
    "MQRO_COA_WITH_FULL_DATA",
    "MQRO_COD",
    "MQRO_COD_WITH_DATA",
    "MQRO_COD_WITH_FULL_DATA",
    "MQRO_DISCARD_MSG",
    "MQRO_EXCEPTION",
    "MQRO_EXCEPTION_WITH_DATA",
    "MQRO_EXCEPTION_WITH_FULL_DATA",
    "MQRO_EXPIRATION",
    "MQRO_EXPIRATION_WITH_DATA",
    "MQRO_EXPIRATION_WITH_FULL_DATA",
    "MQRO_NONE",
    "MQRO_PASS_CORREL_ID",
    "MQRO_PASS_MSG_ID",
    "MSG_TYPE",
    "REPORT_DISCARD",
    "REPORT_EXCEPTION",
    "REPORT_EXPIRATION",
    "REPORT_PASS_CORREL_ID",
    "REPORT_PASS_MSG_ID",
    "Data",
    "Report",
    "ReportKind",
    "ReportOptions",
    "report_body",
    "report_for",
    "report_options",
]

# MQRO constants, as IBM MQ's cmqc.h defines them.
MQRO_NONE = 0x00000000
MQRO_EXCEPTION = 0x01000000
MQRO_EXCEPTION_WITH_DATA = 0x03000000
MQRO_EXCEPTION_WITH_FULL_DATA = 0x07000000
MQRO_EXPIRATION = 0x00200000
MQRO_EXPIRATION_WITH_DATA = 0x00600000
MQRO_EXPIRATION_WITH_FULL_DATA = 0x00E00000
MQRO_COA = 0x00000100
MQRO_COA_WITH_DATA = 0x00000300
MQRO_COA_WITH_FULL_DATA = 0x00000700
MQRO_COD = 0x00000800
MQRO_COD_WITH_DATA = 0x00001800
MQRO_COD_WITH_FULL_DATA = 0x00003800
MQRO_PASS_MSG_ID = 0x00000080
MQRO_PASS_CORREL_ID = 0x00000040
MQRO_DISCARD_MSG = 0x08000000

# The IBM MQ classes for JMS' property names.
REPORT_EXCEPTION = "JMS_IBM_Report_Exception"
REPORT_EXPIRATION = "JMS_IBM_Report_Expiration"
REPORT_DISCARD = "JMS_IBM_Report_Discard_Msg"
REPORT_PASS_MSG_ID = "JMS_IBM_Report_Pass_Msg_ID"
REPORT_PASS_CORREL_ID = "JMS_IBM_Report_Pass_Correl_ID"
# On the report: its message type (MQMT_REPORT) and feedback (MQFB_* or the MQRC code).
MSG_TYPE = "JMS_IBM_MsgType"
FEEDBACK = "JMS_IBM_Feedback"
MQMT_REPORT = 4
CORRELATION_HEADER = "correlation-id"
DATA_BYTES = 100  # what _WITH_DATA includes of the body


class Data(enum.Enum):
    NONE = "none"
    FIRST_100 = "first-100-bytes"
    FULL = "full"


class ReportKind(enum.Enum):
    EXCEPTION = "exception"
    EXPIRATION = "expiration"


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """What a message asked for. ``exception``/``expiration``: None when no such report."""

    exception: Data | None = None
    expiration: Data | None = None
    discard: bool = False
    pass_msg_id: bool = False
    pass_correl_id: bool = False

    @property
    def any(self) -> bool:
        return self.exception is not None or self.expiration is not None or self.discard


NO_OPTIONS = ReportOptions()


def _value(headers: Mapping[str, str], name: str) -> int:
    """The property's MQRO value (``properties.whole_number``, or hexadecimal text); 0 when
    absent or not a whole number (a report the message cannot be understood to ask for is not
    sent: the message was accepted long ago)."""
    text = headers.get(name, "").strip()
    if not text:
        return MQRO_NONE
    if text[:2].lower() == "0x":
        try:
            return int(text, 16)
        except ValueError:
            return MQRO_NONE
    number = whole_number(text)
    return MQRO_NONE if number is None else number


def _data(value: int, plain: int, with_data: int, full: int) -> Data | None:
    """The report a value asks for: the widest of the three forms whose bits are all set."""
    if value & full == full:
        return Data.FULL
    if value & with_data == with_data:
        return Data.FIRST_100
    if value & plain == plain:
        return Data.NONE
    return None


def report_options(headers: Mapping[str, str]) -> ReportOptions:
    """The report options a message's headers carry (IBM's property names and MQRO values)."""
    if not any(name in headers for name in (REPORT_EXCEPTION, REPORT_EXPIRATION, REPORT_DISCARD)):
        return NO_OPTIONS
    return ReportOptions(
        exception=_data(_value(headers, REPORT_EXCEPTION), MQRO_EXCEPTION,
                        MQRO_EXCEPTION_WITH_DATA, MQRO_EXCEPTION_WITH_FULL_DATA),
        expiration=_data(_value(headers, REPORT_EXPIRATION), MQRO_EXPIRATION,
                         MQRO_EXPIRATION_WITH_DATA, MQRO_EXPIRATION_WITH_FULL_DATA),
        discard=bool(_value(headers, REPORT_DISCARD) & MQRO_DISCARD_MSG),
        pass_msg_id=bool(_value(headers, REPORT_PASS_MSG_ID) & MQRO_PASS_MSG_ID),
        pass_correl_id=bool(_value(headers, REPORT_PASS_CORREL_ID) & MQRO_PASS_CORREL_ID),
    )


@dataclass(frozen=True, slots=True)
class Report:
    """A report to put to ``destination`` (the original's reply-to)."""

    kind: ReportKind
    destination: str
    feedback: int  # MQFB_EXPIRATION, or the MQRC code of the refusal
    data: Data
    message_id: str | None  # the report's own id: the original's with MQRO_PASS_MSG_ID
    correlation_id: str  # the original message id, or its correlation id (PASS_CORREL_ID)

    def headers(self) -> dict[str, str]:
        """The report's own headers (IBM's names), besides the bridge's metadata."""
        return {
            MSG_TYPE: str(MQMT_REPORT),
            FEEDBACK: str(self.feedback),
            CORRELATION_HEADER: self.correlation_id,
        }


def report_for(
    kind: ReportKind,
    options: ReportOptions,
    *,
    reply_to: str | None,
    reason: Reason,
    original_id: str,
    correlation_id: str | None = None,
) -> Report | None:
    """The report a message is owed when it fails this way, or None: it asked for none of this
    kind, or named no reply-to (IBM MQ needs ReplyToQ for a report; without one none is sent).
    ``reason`` is MQFB_EXPIRATION for an expiry, else the refusal's MQRC reason."""
    data = options.exception if kind is ReportKind.EXCEPTION else options.expiration
    if data is None or not reply_to:
        return None
    feedback = MQFB_EXPIRATION.code if kind is ReportKind.EXPIRATION else reason.code
    return Report(
        kind=kind,
        destination=reply_to,
        feedback=feedback,
        data=data,
        message_id=original_id if options.pass_msg_id else None,
        correlation_id=(correlation_id or "") if options.pass_correl_id else original_id,
    )


def report_body(data: Data, body: bytes) -> bytes:
    """What of the original's body the report carries."""
    if data is Data.FULL:
        return body
    if data is Data.FIRST_100:
        return body[:DATA_BYTES]
    return b""
