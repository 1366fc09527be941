"""jms-bridge: a STOMP / AMQP 0-9-1 sidecar that adds JMS delivery semantics to a broker."""

from bridge import compiled as _compiled

__version__ = "0.1.0"

# Before any module ``compiled.MODULES`` names can be imported: compiled or from source.
_compiled.install()
