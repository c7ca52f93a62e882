"""Write the names file of Feast repositories from their declarations, after editing them.

    python -m cli.feast_names [REPO ...] [--check]

A use case's references into Feast (its feature service, label view and columns, slice, drift
and baseline columns) are checked when the code location loads against
`feature_repo/<name>/feast_names.json` (`declare.references`), which this command writes from the
declarations as Feast parses them (`resources.feast_names`). REPO defaults to every repository
under `feature_repo/`. With `--check` nothing is written, and the command fails when a file is
not what its declarations name. Feast is imported (~11 s).
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from declare.feast_names import NAMES_FILE, FeastNames
from resources.feast_names import FEATURE_STORE_YAML, names_of, parse
from resources.feature_store import DEFAULT_REPO


def repositories() -> list[Path]:
    """The project's Feast repositories: every folder of `feature_repo/` with settings."""
    return sorted(path.parent for path in DEFAULT_REPO.glob(f"*/{FEATURE_STORE_YAML}"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cli.feast_names",
        description=f"Write each Feast repository's {NAMES_FILE} from its declarations.",
    )
    parser.add_argument("repos", nargs="*", type=Path, metavar="REPO", help="a Feast repository")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; fail if a file is out of date"
    )
    args = parser.parse_args(argv)
    stale = []
    for repo in [path.absolute() for path in args.repos] or repositories():
        names = names_of(parse(repo))
        if args.check:
            try:
                current = FeastNames.read(repo) == names
            except FileNotFoundError:
                current = False
            state = "up to date" if current else "out of date"
            stale += [] if current else [repo]
        else:
            state = "written" if names.write(repo) else "unchanged"
        sys.stdout.write(f"{repo / NAMES_FILE}: {state}\n")
    if stale:
        sys.stderr.write(f"run `python -m cli.feast_names {' '.join(map(str, stale))}`\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
