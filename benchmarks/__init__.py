"""Ratio benchmarks of ../shared/QUALITY.md: `make bench` prints one table and writes
benchmarks/results/latest.json. Benchmarks report speed; tests check behaviour."""
