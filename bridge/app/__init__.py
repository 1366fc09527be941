"""The application: command line, settings, the serving process, admin HTTP, metrics and logs."""
