"""Every run-config key, from the one schema: listed for a reader, and written into pyproject.toml.

Flower needs each key's default in ``[tool.flwr.app.config]``; that block is generated from the schema (the keys
of :mod:`hetfl.common.config` and of every method package), never edited by hand, and a test fails when the file
and the schema differ.

    python -m hetfl.keys [--method fens]        # the keys a method reads, with default and allowed values
    python -m hetfl.keys --write-pyproject      # regenerate pyproject.toml's [tool.flwr.app.config] block
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hetfl.common.config import Key
from hetfl.methods import SCHEMA

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
HEADER = "[tool.flwr.app.config]"
INTRO = ("# Every run-config key with its default, generated from the schema (hetfl.methods.SCHEMA: common keys and the methods'\n"
         "# parameter objects) by `python -m hetfl.keys --write-pyproject`; do not edit by hand (tests/test_config.py checks it).\n")


def assignment(k: Key) -> str:
    """``name = default`` as TOML writes it (tomli_w, as the launcher writes run configs)."""
    import tomli_w

    return tomli_w.dumps({k.name: k.default}).strip()


def line(k: Key) -> str:
    """``name = default  # doc; allowed values`` (the methods that read it, where not every method does)."""
    who = f" (read by {', '.join(k.methods)})" if k.methods and len(k.methods) <= 3 else ""
    return f"{assignment(k):<34}# {k.doc}; {k.allowed()}{who}"


def pyproject_block() -> str:
    """The whole ``[tool.flwr.app.config]`` table, from its header to the blank line after it."""
    return INTRO + HEADER + "\n" + "\n".join(line(k) for k in SCHEMA.values()) + "\n"


def _block_span(text: str) -> tuple[int, int]:
    """Where the generated block (its comment, header and keys) stands in pyproject.toml's text."""
    start = text.index(HEADER)
    intro = text.rfind("\n\n", 0, start) + 2  # the comment lines just above the header belong to the block
    end = text.index("\n\n", start) + 1
    return intro, end


def current_block(path: Path = PYPROJECT) -> str:
    text = path.read_text()
    a, b = _block_span(text)
    return text[a:b]


def write_pyproject(path: Path = PYPROJECT) -> bool:
    """Rewrite the block in place; True if the file changed."""
    text = path.read_text()
    a, b = _block_span(text)
    new = text[:a] + pyproject_block() + text[b:]
    if new != text:
        path.write_text(new)
    return new != text


def table(method: str | None = None) -> str:
    """The keys a run of `method` reads (every key when None): name, default, the methods that read it ('all' = every
    method), its meaning and its allowed values, one per line."""
    keys = [k for k in SCHEMA.values() if method is None or not k.methods or method in k.methods]
    width = max(len(k.name) for k in keys)
    return "\n".join(f"{k.name:<{width}}  {k.default!r:<12}  {'/'.join(k.methods) or 'all':<12}  {k.doc}; {k.allowed()}"
                     for k in keys)


def main(argv: list[str] | None = None, prog: str = "python -m hetfl.keys") -> int:
    p = argparse.ArgumentParser(prog=prog, description="List the run-config keys (from the schema), or regenerate "
                                "pyproject.toml's [tool.flwr.app.config] block from it.")
    p.add_argument("--method", choices=SCHEMA["method"].choices, help="only the keys this method reads")
    p.add_argument("--write-pyproject", action="store_true", help="rewrite pyproject.toml's config block")
    a = p.parse_args(argv)
    if a.write_pyproject:
        print(f"{PYPROJECT}: {'rewritten' if write_pyproject() else 'already up to date'}")
        return 0
    print(table(a.method))
    return 0


if __name__ == "__main__":
    sys.exit(main())
