"""What RabbitMQ's management API says of queues.

- ``queue_arguments``: a queue's own arguments (``GET /api/queues/VHOST/NAME``), the port
  ``bridge.app.queue_policies`` reads a queue's declared delayed-retry schedule through.
  RabbitMQ keeps every ``x-`` argument a declare gave, the ones it does not know too, so the
  broker is where they are found after a bridge restarts.
- ``queue_counts``: the queues whose names match a regular expression, with their message
  counts, page by page. Asked with a page, RabbitMQ filters and pages its queue records first
  and adds the statistics (``messages``) to that page only; asked without one, it builds the
  statistics of every queue of the vhost, seconds on a broker with ten thousand queues.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable

PAGE_SIZE = 500  # the most RabbitMQ gives in one page
ATTEMPTS = 3  # listings begun again when the queues matched changed between two pages


def get_json(management: Endpoint, url: str, timeout: float) -> Any:
    """GET ``url`` of the management API with its credentials, as JSON; urllib's errors
    (HTTPError, OSError) and ValueError for a body that is not JSON."""
    request = urllib.request.Request(url)
    token = base64.b64encode(
        f"{management.user or 'guest'}:{management.password or 'guest'}".encode())
    request.add_header("Authorization", "Basic " + token.decode())
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def queues_url(management: Endpoint, vhost: str | None) -> str:
    """The management API's URL of the queues of ``vhost`` (None: ``/``)."""
    path = urllib.parse.quote(vhost or "/", safe="")
    return f"http://{management.host}:{management.port}/api/queues/{path}"


def queues_query(matching: str | None, page: int, page_size: int = PAGE_SIZE) -> str:
    """The query of one page of ``GET /api/queues/VHOST``: each queue's name and message count,
    in name order, only of the queues whose name contains a match of ``matching`` (RabbitMQ
    reads it as a PCRE, caseless) when it is given."""
    params = {"page": str(page), "page_size": str(page_size), "columns": "name,messages"}
    if matching is not None:
        params |= {"name": matching, "use_regex": "true"}
    return urllib.parse.urlencode(params, quote_via=urllib.parse.quote)


def queue_counts(management: Endpoint, vhost: str | None, matching: str | None,
                 timeout: float = 5.0, page_size: int = PAGE_SIZE) -> dict[str, int]:
    """The queues of ``vhost`` (None: ``/``) whose names match ``matching`` (None: all), with
    their message counts. A queue made or deleted between two pages can move another across
    the page boundary: when the number matched changes, the listing begins again.
    BrokerUnavailable when the API cannot be asked, does not answer sensibly, or the queues
    keep changing."""
    base = queues_url(management, vhost)
    for _ in range(ATTEMPTS):
        counts: dict[str, int] = {}
        matched: object = None
        page, pages = 1, 1
        while page <= pages:
            answer = _page(management, f"{base}?{queues_query(matching, page, page_size)}",
                           timeout, page)
            if answer is None or (page > 1 and answer.get("filtered_count") != matched):
                break  # fewer pages than before, or other queues match now: begin again
            matched = answer.get("filtered_count")
            pages = int(answer.get("page_count") or 0)
            for row in answer["items"]:
                if isinstance(row, dict) and "name" in row:
                    counts[str(row["name"])] = int(row.get("messages") or 0)
            page += 1
        else:
            return counts
    raise BrokerUnavailable(f"RabbitMQ management API at {base}: the queues kept changing "
                            f"while they were listed ({ATTEMPTS} tries)")


def _page(management: Endpoint, url: str, timeout: float, page: int) -> dict[str, Any] | None:
    """One page of queues; None for a page past the last (RabbitMQ answers 400 when the list
    has shrunk since the first page)."""
    where = f"RabbitMQ management API at {url.partition('?')[0]} (page {page})"
    try:
        answer = get_json(management, url, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 400 and page > 1:
            return None
        raise BrokerUnavailable(f"{where}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise BrokerUnavailable(f"{where}: {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise BrokerUnavailable(f"{where}: {exc}") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("items"), list):
        raise BrokerUnavailable(f"{where}: not a page of queues")
    return answer


def queue_arguments(management: Endpoint, vhost: str | None, queue: str,
                    timeout: float = 5.0) -> dict[str, object] | None:
    """``queue``'s arguments in ``vhost`` (None: the default ``/``); None when there is no such
    queue. BrokerUnavailable when the API cannot be asked or does not answer sensibly."""
    url = f"{queues_url(management, vhost)}/{urllib.parse.quote(queue, safe='')}"
    try:
        info = get_json(management, url, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise BrokerUnavailable(f"RabbitMQ management API at {url}: HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise BrokerUnavailable(f"RabbitMQ management API at {url}: {exc}") from None
    found = info.get("arguments") if isinstance(info, dict) else None
    return dict(found) if isinstance(found, dict) else {}
