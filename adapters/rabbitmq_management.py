"""A queue's own arguments, as RabbitMQ's management API shows them (``GET
/api/queues/VHOST/NAME``): the port ``bridge.app.queue_policies`` reads a queue's declared
delayed-retry schedule through. RabbitMQ keeps every ``x-`` argument a declare gave, the ones
it does not know too, so the broker is where they are found after a bridge restarts.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable


def queue_arguments(management: Endpoint, vhost: str | None, queue: str,
                    timeout: float = 5.0) -> dict[str, object] | None:
    """``queue``'s arguments in ``vhost`` (None: the default ``/``); None when there is no such
    queue. BrokerUnavailable when the API cannot be asked or does not answer sensibly."""
    path = "/".join(urllib.parse.quote(part, safe="") for part in (vhost or "/", queue))
    url = f"http://{management.host}:{management.port}/api/queues/{path}"
    request = urllib.request.Request(url)
    token = base64.b64encode(
        f"{management.user or 'guest'}:{management.password or 'guest'}".encode())
    request.add_header("Authorization", "Basic " + token.decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            info = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise BrokerUnavailable(f"RabbitMQ management API at {url}: HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise BrokerUnavailable(f"RabbitMQ management API at {url}: {exc}") from None
    found = info.get("arguments") if isinstance(info, dict) else None
    return dict(found) if isinstance(found, dict) else {}
