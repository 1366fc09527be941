"""Every example the README and the docs pages mark as checked runs, or parses, as printed.

The convention: an HTML comment on the line right before a fenced block (blank lines between
them are allowed) says what the block is and how it is checked::

    <!-- check: KIND [NAME] -->
    ```yaml
    ...
    ```

KIND is one of

- ``config [FILE]``: a bridge configuration file (YAML): read by the bridge's own loader
  (``bridge.app.config``), so every setting is validated and every redelivery policy and
  message-retry table compiled. With FILE it is also saved under that name in a folder of the
  page's own, where the page's later ``run`` blocks find it.
- ``helm-values``: values given to ``charts/jms-bridge``: merged over its ``values.yaml`` as Helm
  does, checked against its ``values.schema.json``, and its ``bridge.redelivery`` (if any)
  compiled as the bridge would.
- ``yaml``: YAML that is someone else's (another chart's values, a manifest of several
  documents): parsed only.
- ``rules``: a ``dlq handle`` rules table, parsed by ``policies.dlqrules`` (its selectors too).
- ``selector``: one JMS selector a line, parsed by ``policies.selector``.
- ``journal``: JSON lines, each checked against ``bridge/app/journal.schema.json``.
- ``cli``: a shell example. Every command in it that starts with ``jms-bridge`` (or
  ``.venv/bin/jms-bridge``, or after a ``$ `` prompt) is parsed by the command's own parser and
  its settings resolved as the command would (so a bad flag value fails), and every
  ``--selector`` is compiled; ``\\`` continues a line, ``#`` starts a comment, an optional
  part shown in ``[...]`` is checked as if given. Other commands (openssl, helm) are left alone.
- ``run``: a transcript that needs no broker: each ``$ jms-bridge ...`` line is run (in the
  page's folder) and must exit 0 and print the lines that follow it, where ``...`` in a line
  stands for any text.
- ``synopsis``: a usage summary (``jms-bridge dlq browse [--queue Q] ...``): every ``--flag`` in
  a line must be one the subcommand it names accepts.

A fenced block without such a comment is not checked. Pages: ``README.md`` and
``docs/**/*.md``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
import yaml

from bridge.app import cli
from bridge.app.config import resolve
from policies.dlqrules import parse_rules
from policies.errors import BridgeError
from policies.redelivery import compile_table
from policies.selector import compile_selector

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
KINDS = ("config", "helm-values", "yaml", "rules", "selector", "journal", "cli", "run",
         "synopsis")
_CHECK = re.compile(r"<!--\s*check:\s*([a-z-]+)((?:\s+[^\s-][^\s]*)*)\s*-->")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True)
class Example:
    page: Path
    line: int  # of the opening fence
    kind: str
    args: tuple[str, ...]
    text: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}:{self.kind}"


def examples(page: Path) -> list[Example]:
    """The marked fenced blocks of a page, in order. A marker not followed by a block, or of an
    unknown kind, is an error (a typo must not silently turn a check off)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    marker: tuple[int, str, tuple[str, ...]] | None = None
    at = 0
    while at < len(lines):
        line = lines[at]
        fence = _FENCE.match(line)
        if fence:
            indent, ticks = fence.group(1), fence.group(2)
            body: list[str] = []
            at += 1
            while at < len(lines) and not lines[at].strip().startswith(ticks):
                body.append(lines[at].removeprefix(indent))
                at += 1
            if marker is not None:
                found.append(Example(page, marker[0] + 1, marker[1], marker[2],
                                     "\n".join(body) + "\n"))
                marker = None
        elif "<!--" in line and "check:" in line:
            match = _CHECK.search(line)
            where = f"{page.relative_to(ROOT)}:{at + 1}"
            assert match and match.group(1) in KINDS, f"{where}: a check marker of no known kind"
            assert marker is None, f"{where}: two check markers, one block"
            marker = (at + 1, match.group(1), tuple(match.group(2).split()))
        elif line.strip() and marker is not None:
            raise AssertionError(f"{page.relative_to(ROOT)}:{marker[0]}: a check marker "
                                 "not right before a fenced block")
        at += 1
    assert marker is None, f"{page.relative_to(ROOT)}:{marker[0]}: a check marker at the end"
    return found


ALL = [e for page in PAGES for e in examples(page)]


def _commands(text: str) -> list[list[str]]:
    """The ``jms-bridge`` commands of a shell example, as argument lists (without the program)."""
    joined = re.sub(r"\\\n", " ", text)
    out: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip().removeprefix("$ ")
        words = shlex.split(line, comments=True)
        if not words or not words[0].endswith("jms-bridge"):
            continue
        args = []
        for word in words[1:]:
            if word in ("[", "]"):
                continue
            args.append(word.removeprefix("[").removesuffix("]") if word.startswith("[-")
                        or word.endswith("]") else word)
        out.append(args)
    return out


def _check_cli(args: list[str]) -> None:
    try:
        ns = cli.build_parser().parse_args(args)
    except SystemExit as exit_:
        raise AssertionError(f"jms-bridge {' '.join(args)}: the parser refused it "
                             f"(exit {exit_.code})") from None
    if ns.command != "report":
        config = getattr(ns, "config", None)
        if config is None or Path(config).exists():
            resolve(cli._settings_flags(ns), config_file=config, environ={})
    selector = getattr(ns, "selector", None)
    if selector:
        compile_selector(selector)


def _run(transcript: str, folder: Path) -> None:
    blocks: list[tuple[list[str], list[str]]] = []
    for line in transcript.splitlines():
        if line.startswith("$ "):
            blocks.append((shlex.split(line[2:]), []))
        elif blocks:
            blocks[-1][1].append(line)
    assert blocks, "a run example without a $ command"
    for words, expected in blocks:
        assert words[0] == "jms-bridge", f"only jms-bridge commands run here: {words}"
        out, err = io.StringIO(), io.StringIO()
        with contextlib.chdir(folder), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            code = cli.main(words[1:])
        assert code == 0, f"{' '.join(words)}: exit {code}: {err.getvalue()}"
        got = out.getvalue().splitlines()
        assert len(got) == len(expected), f"{' '.join(words)} printed:\n{out.getvalue()}"
        for want, line in zip(expected, got, strict=True):
            pattern = ".*".join(re.escape(part) for part in want.split("..."))
            assert re.fullmatch(pattern, line), f"expected {want!r}, printed {line!r}"


def _check_synopsis(text: str) -> None:
    parser = cli.build_parser()
    for line in re.sub(r"\\\n", " ", text).splitlines():
        words = line.split()
        if not words or not words[0].endswith("jms-bridge"):
            continue
        path = []
        for word in words[1:]:
            if not re.fullmatch(r"[a-z]+", word):
                break
            path.append(word)
        sub = parser
        for name in path:
            sub = _subparser(sub, name)
        known = set(sub._option_string_actions)  # (argparse has no public API for these)
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", line):
            assert flag in known, f"{' '.join(path)}: no flag {flag}"


def _subparser(parser: object, name: str) -> object:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            assert name in action.choices, f"no subcommand {name!r}"
            return action.choices[name]
    raise AssertionError(f"no subcommand {name!r}")


def _merged(base: object, over: object) -> object:
    """``over`` merged into ``base`` as Helm merges given values into a chart's."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merged(base.get(k), v) for k, v in over.items()}}
    return over


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    """A folder per page, where its named config blocks are saved for its run blocks."""
    out: dict[Path, Path] = {}
    for page in PAGES:
        folder = tmp_path_factory.mktemp(page.stem)
        for e in examples(page):
            if e.kind == "config" and e.args:
                (folder / e.args[0]).write_text(e.text, encoding="utf-8")
        out[page] = folder
    return out


def test_the_pages_mark_their_examples() -> None:
    # The README is a front page (its tour's commands); the guides hold the rest of the examples.
    assert "cli" in {e.kind for e in ALL if e.page.name == "README.md"}
    kinds = {e.kind for e in ALL}
    assert {"config", "rules", "cli", "run", "helm-values", "journal", "synopsis"} <= kinds


@pytest.mark.parametrize("example", ALL, ids=[e.id for e in ALL])
def test_example(example: Example, folders: dict[Path, Path], tmp_path: Path) -> None:
    check(example, folders[example.page], tmp_path)


BAD = [
    ("config", "redelivery:\n  /queue/a: '10:abc'\n", "delay must be milliseconds"),
    ("config", "no-such-setting: 1\n", "unknown setting"),
    ("helm-values", "service:\n  ports:\n    stomp: 'x'\n", "is not of type 'integer'"),
    # refused by the chart's schema before the compiler sees it
    ("helm-values", "bridge:\n  redelivery:\n    /queue/a: '5:x'\n", "['bridge']['redelivery']"),
    ("yaml", "a: [\n", "expected"),
    ("rules", "ACTION(DISCARD)   control data, not a comment\n", "expected KEYWORD"),
    ("selector", "JMSPriority >> 4\n", "column"),
    ("journal", '{"v": 1}\n', "is a required property"),
    ("cli", "jms-bridge dlq browse --limit many\n", "the parser refused it"),
    ("cli", "jms-bridge run --staging-queue-type quorum --broker activemq\n", "quorum"),
    ("cli", "jms-bridge dlq count --selector \"a >> 1\"\n", "column"),
    ("run", "$ jms-bridge policy show /queue/a\n/queue/a: something else\n", "printed"),
    ("run", "$ jms-bridge policy show --config none.yaml /queue/a\n", "exit 1"),
    ("synopsis", "jms-bridge dlq browse [--queue Q] [--no-such-flag]\n", "no flag --no-such"),
]


@pytest.mark.parametrize(("kind", "text", "words"), BAD,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BAD)])
def test_a_bad_example_fails(kind: str, text: str, words: str, tmp_path: Path) -> None:
    example = Example(ROOT / "README.md", 1, kind, (), text)
    with pytest.raises((AssertionError, BridgeError, yaml.YAMLError,
                        jsonschema.ValidationError)) as caught:
        check(example, tmp_path, tmp_path)
    assert words in str(caught.value)


def check(example: Example, folder: Path, tmp_path: Path) -> None:
    kind, text = example.kind, example.text
    if kind == "config":
        path = tmp_path / "config.yaml"
        path.write_text(text, encoding="utf-8")
        resolve({}, config_file=str(path), environ={})
    elif kind == "helm-values":
        values = yaml.safe_load(text)
        chart = ROOT / "charts/jms-bridge"
        defaults = yaml.safe_load((chart / "values.yaml").read_text())
        schema = json.loads((chart / "values.schema.json").read_text())
        jsonschema.validate(_merged(defaults, values), schema)
        redelivery = values.get("bridge", {}).get("redelivery")
        if redelivery is not None:
            compile_table(redelivery, source="bridge.redelivery")
    elif kind == "yaml":
        list(yaml.safe_load_all(text))  # a manifest may hold several documents
    elif kind == "rules":
        parse_rules(text, source=example.id)
    elif kind == "selector":
        for line in text.splitlines():
            if line.strip():
                compile_selector(line.strip())
    elif kind == "journal":
        schema = json.loads((ROOT / "bridge/app/journal.schema.json").read_text())
        for line in text.splitlines():
            jsonschema.validate(json.loads(line), schema)
    elif kind == "cli":
        commands = _commands(text)
        assert commands, "a cli example without a jms-bridge command"
        for args in commands:
            _check_cli(args)
    elif kind == "run":
        _run(text, folder)
    else:
        assert kind == "synopsis"
        _check_synopsis(text)
