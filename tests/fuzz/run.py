"""Coverage-guided fuzzing of one target with atheris (libFuzzer): ``scripts/fuzz`` runs this.

    python -m tests.fuzz.run TARGET [libFuzzer flags] [CORPUS_DIR...]

The bridge's own modules and pamqp are instrumented, so that libFuzzer sees which branches an
input reaches. Limits go to libFuzzer as flags: ``-timeout=1`` (an input that runs for over a
second is a finding) and ``-rss_limit_mb`` (memory is bounded).
"""

from __future__ import annotations

import sys

import atheris  # type: ignore[import-untyped]

# What each target exercises: only these are instrumented (the rest is imported plain, which
# keeps start-up short and the coverage signal about the code under test).
INSTRUMENTED = {
    "stomp": ["bridge.frontends.stomp", "bridge.intercept", "policies"],
    "amqp": ["bridge.frontends.amqp", "bridge.intercept", "policies", "pamqp"],
    "selector": ["policies.selector"],
}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in INSTRUMENTED:
        sys.exit("usage: python -m tests.fuzz.run stomp|amqp|selector [libFuzzer args]")
    name = argv.pop(1)
    with atheris.instrument_imports(include=INSTRUMENTED[name]):
        from tests.fuzz.targets import TARGETS
    target = TARGETS[name]
    atheris.Setup(argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
