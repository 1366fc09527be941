"""Delivery delay: staged messages wait on broker queues and are released when due."""
