"""Suite-wide settings."""

from collections.abc import Iterator

import pytest
import structlog
from hypothesis import settings

# Property tests check what is parsed or refused, never how fast: on two shared cores a busy
# moment must not fail one example for exceeding hypothesis's default 200 ms deadline.
settings.register_profile("jms-bridge", deadline=None, print_blob=True)
settings.load_profile("jms-bridge")


@pytest.fixture(autouse=True)
def _structlog_as_before() -> Iterator[None]:
    """A test that runs the CLI's main() sets structlog up to print to the sys.stderr of that
    moment, capsys's, closed after the test: put structlog back so later tests do not log there."""
    yield
    structlog.reset_defaults()
