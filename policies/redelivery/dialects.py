"""One policy value from the configuration, in any dialect, parsed into a Policy.

A value is either a JMSJCA string (``"5:1000; 10:5000; 50:move(queue:dlq$error)"``) or a mapping
that names its ``dialect:`` and uses that dialect's own setting names::

    {dialect: weblogic, redelivery-limit: 5, error-destination: /queue/billing.errors}

Dialects: ``jmsjca`` (the string under ``JMSJCA.redeliveryhandling:``), ``weblogic``,
``jboss``, ``websphere``, ``tibco``, ``activemq``, ``artemis``; each module documents its
settings, defaults and what they map to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from policies.errors import ConfigError
from policies.redelivery.activemq import parse_activemq
from policies.redelivery.artemis import parse_artemis
from policies.redelivery.jboss import parse_jboss
from policies.redelivery.jmsjca import parse_jmsjca
from policies.redelivery.model import Policy
from policies.redelivery.settings import Settings, describe_value, normalize
from policies.redelivery.tibco import parse_tibco
from policies.redelivery.weblogic import parse_weblogic
from policies.redelivery.websphere import parse_websphere

__all__ = ["DIALECTS", "parse_policy"]

_JMSJCA_SETTINGS: dict[str, tuple[str, ...]] = {
    "JMSJCA.redeliveryhandling": ("redeliveryhandling",),
}


def _parse_jmsjca_mapping(values: Mapping[object, object]) -> Policy:
    settings = Settings("jmsjca", values, _JMSJCA_SETTINGS)
    text = settings.text("JMSJCA.redeliveryhandling", None)
    if text is None:
        raise ConfigError("a jmsjca policy needs JMSJCA.redeliveryhandling: \"5:1000; ...\"")
    return parse_jmsjca(text)


DIALECTS: dict[str, Callable[[Mapping[object, object]], Policy]] = {
    "jmsjca": _parse_jmsjca_mapping,
    "weblogic": parse_weblogic,
    "jboss": parse_jboss,
    "websphere": parse_websphere,
    "tibco": parse_tibco,
    "activemq": parse_activemq,
    "artemis": parse_artemis,
}


def parse_policy(value: object) -> Policy:
    """Parse one policy; a ConfigError's message names the offending part (not the pattern)."""
    if isinstance(value, str):
        return parse_jmsjca(value)
    if isinstance(value, Mapping):
        dialect = next((v for k, v in value.items()
                        if isinstance(k, str) and normalize(k) == "dialect"), None)
        if dialect is None:
            raise ConfigError(f"a policy mapping needs dialect: (one of {', '.join(DIALECTS)})")
        parser = DIALECTS.get(dialect.strip().lower()) if isinstance(dialect, str) else None
        if parser is None:
            raise ConfigError(f"unknown dialect {describe_value(dialect)} "
                              f"(one of {', '.join(DIALECTS)})")
        return parser(value)
    hint = ""
    if isinstance(value, int) and not isinstance(value, bool):
        hint = " (YAML reads an unquoted 5:50 as the number 350: quote the policy string)"
    raise ConfigError(
        f"a policy is a JMSJCA string such as \"5:1000; 50:delete\" or a mapping with dialect:, "
        f"got {describe_value(value)}{hint}"
    )
