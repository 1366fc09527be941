"""PySpark jobs over the event journal (``bridge.app.journal``): ``report`` (tables and an HTML
page of charts) and, for replay, JMS selectors compiled to Spark SQL (``spark_selectors``).

Spark is an optional dependency (the ``pipeline`` extra); nothing else in the bridge imports
this package.
"""
