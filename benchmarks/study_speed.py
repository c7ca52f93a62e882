"""P17: a study's wall time with its trials side by side against one at a time.

    python -m benchmarks.study_speed --data <training set> --workers 2 --trials 6 --epochs 4

One measure: the flights' `study` asset materialized in a fresh home (the path `make tune` and
the UI take: LocalTorchrun, MLflow, journal storage or `--storage`), on the synthetic training
set of `benchmarks.training_speed`, from a catalog entry of `--epochs` epochs and no early stop.
Every trial is in the sampler's random start (seeded; its values drawn in the order trials are asked
for) and nothing is pruned, so 1 and 2 workers train the same trials, each the same number of
epochs. Prints one JSON line: the wall time and the trials' best loss, which both sides must
share.
"""

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

SPACE_TRIALS = 1_000
"""The random start covers every trial (TPE models nothing), so trials do not depend on the
order in which earlier ones finished."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--storage",
        default="",
        help="the study's storage (e.g. a PostgreSQL URL, the production profile's); default:"
        " a journal file in the measure's home",
    )
    args = parser.parse_args()

    import dagster as dg

    from assets.tuning import tuning_assets
    from declare import BASELINE, Catalog, SearchPolicy
    from resources.launchers import LocalTorchrun
    from resources.registry import local_registry
    from resources.studies import StudyStorage
    from usecases import FLIGHTS

    with tempfile.TemporaryDirectory(prefix="bench-study-") as folder:
        home = Path(folder)
        configs = home / "configs"
        configs.mkdir()
        (configs / f"{BASELINE}.toml").write_text(
            f"[training.optim]\nmax_epochs = {args.epochs}\npatience_epochs = {args.epochs}\n"
        )
        # Declared: 2 side by side, so each trial's share is a core (`assets.tuning`), whatever
        # the run's own `workers`: the same trials, layout included, on either side.
        search = SearchPolicy(trials=args.trials, workers=2, startup_trials=SPACE_TRIALS)
        case = dataclasses.replace(FLIGHTS, configs=Catalog(configs), search=search)
        (study,) = tuning_assets(case)
        data = args.data

        @dg.input_manager
        def lake_paths(_):
            return data

        began = time.perf_counter()
        result = dg.materialize(
            [study, dg.AssetSpec(["flights", "training_set"])],
            resources={
                "lake_paths": lake_paths,
                "launcher": LocalTorchrun(output_root=str(home / "models")),
                "mlflow": local_registry(home),
                "studies": StudyStorage(url=args.storage or f"journal:{home / 'studies.log'}"),
            },
            # A study of its own on a shared storage: never resumed from another measure's.
            run_config={
                "ops": {"flights__study": {"config": {"workers": args.workers, "study": home.name}}}
            },
            instance=dg.DagsterInstance.ephemeral(),
        )
        seconds = time.perf_counter() - began
        (materialization,) = result.asset_materializations_for_node("flights__study")
        shown = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    print(
        json.dumps(
            {
                "seconds": seconds,
                "trials": shown["trials"],
                "complete": shown.get("trials_complete", 0),
                "best_validation_loss": shown.get("best_validation_loss"),
            }
        )
    )


if __name__ == "__main__":
    main()
