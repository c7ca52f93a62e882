"""What the Dagster UI shows of the Definitions, as plain data: every asset (group, kinds,
partitions, parents, description, code version, launchpad config), check, job, schedule, sensor
and resource. `tests/definitions.json` holds it as it stands; a reshaping of the code must leave
it unchanged (tests/unit/test_definitions.py), and a change of what the UI shows rewrites it on
purpose: `python -m tests.definitions_snapshot --write`."""

import json
import sys
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("definitions.json")


def _fields(config_type: Any) -> dict | None:
    fields = getattr(config_type, "fields", None)
    if not fields:
        return None
    out = {}
    for name, f in fields.items():
        inner = _fields(f.config_type)
        out[name] = (
            inner
            if inner is not None
            else {
                "type": f.config_type.given_name or f.config_type.key,
                "default": f.default_value if f.default_provided else "<required>",
            }
        )
    return out


def _config(node_def: Any) -> dict | None:
    schema = getattr(node_def, "config_schema", None)
    if schema is None or schema.config_type is None:
        return None
    return _fields(schema.config_type)


def snapshot() -> dict[str, Any]:
    """The loaded Definitions as the UI shows them."""
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    out: dict[str, Any] = {"assets": {}, "checks": [], "jobs": {}, "schedules": {}, "sensors": {}}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        out["assets"][key.to_user_string()] = {
            "group": node.group_name,
            "kinds": sorted(node.kinds),
            "partitions": type(node.partitions_def).__name__ if node.partitions_def else None,
            "parents": sorted(k.to_user_string() for k in node.parent_keys),
            "description": node.description,
            "code_version": node.code_version,
            "automation": str(node.automation_condition) if node.automation_condition else None,
            "config": _config(node.assets_def.node_def),
        }
    checks = sorted(graph.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name))
    out["checks"] = [[check.asset_key.to_user_string(), check.name] for check in checks]
    for job in sorted(defs.resolve_all_job_defs(), key=lambda j: j.name):
        if not job.name.startswith("__"):
            out["jobs"][job.name] = {"ops": sorted(job.graph.node_names()), "tags": dict(job.tags)}
    repo = defs.get_repository_def()
    for s in sorted(repo.schedule_defs, key=lambda s: s.name):
        out["schedules"][s.name] = {
            "cron": s.cron_schedule,
            "timezone": s.execution_timezone,
            "job": s.job_name,
            "status": str(s.default_status),
        }
    for s in sorted(repo.sensor_defs, key=lambda s: s.name):
        out["sensors"][s.name] = {
            "status": str(s.default_status),
            "interval_s": s.minimum_interval_seconds,
        }
    out["resources"] = sorted((defs.resources or {}).keys())
    return json.loads(json.dumps(out, sort_keys=True, default=str))


def main(argv: list[str]) -> int:
    text = json.dumps(snapshot(), indent=1, sort_keys=True) + "\n"
    if argv == ["--write"]:
        SNAPSHOT.write_text(text)
        print(f"wrote {SNAPSHOT}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
