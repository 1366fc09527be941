"""Broker adapters: RabbitMQ through pika, ActiveMQ through stomp.py, behind one interface
(``adapters.base.StagingBroker``). They import only ``policies`` (errors, endpoints, reasons)."""
