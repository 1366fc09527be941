"""Pure policy functions: validation, redelivery, dead-letter routing, reports, selectors."""
