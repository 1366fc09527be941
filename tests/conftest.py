"""Suite-wide settings."""

from hypothesis import settings

# Property tests check what is parsed or refused, never how fast: on two shared cores a busy
# moment must not fail one example for exceeding hypothesis's default 200 ms deadline.
settings.register_profile("jms-bridge", deadline=None, print_blob=True)
settings.load_profile("jms-bridge")
