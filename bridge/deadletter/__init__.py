"""The dead-letter tools: ``jms-bridge dlq list|count|browse|purge|replay|move|export|handle``.

``metadata`` (what a dead letter says about itself), ``ops`` (the operations), ``archive``
(``export``'s files), ``handler`` (the runmqdlq-style rules handler), ``stats`` (counters).
They speak to the broker only through ``adapters.queues.QueueTools``.
"""
