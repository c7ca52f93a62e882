"""Print docs/serving.md's table of the gate's rules, as the registry makes it.

    python -m cli.gate_rules

The rules, what each reads and the policy fields it uses with their defaults are declared once,
in `declare.gate` (`GATE_RULES`, `GatePolicy`, `RegressionGatePolicy`); the docs hold this
command's output between their `gate-rules` markers, and tests/unit/test_gate.py fails when they
differ.
"""

import sys

from declare.gate import rules_table

if __name__ == "__main__":
    sys.stdout.write(rules_table() + "\n")
