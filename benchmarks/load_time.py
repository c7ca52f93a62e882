"""P1: code-location load time ÷ `import dagster`, each in a fresh interpreter.

Loading the code location means what Dagster's code server does: import the module and build the
repository (asset graph, jobs, checks) from its Definitions.
"""

import argparse
import json
import time

PROBES = {
    "dagster": "import dagster",
    "code_location": (
        "import pipelines.definitions as d; d.defs.get_repository_def().get_all_jobs()"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("probe", choices=sorted(PROBES))
    args = parser.parse_args()
    began = time.perf_counter()
    exec(PROBES[args.probe])  # a fixed probe from this file, not input
    print(json.dumps({"seconds": time.perf_counter() - began}))


if __name__ == "__main__":
    main()
