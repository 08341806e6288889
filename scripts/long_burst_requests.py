#!/usr/bin/env python3
"""Writes a request file (the Azure trace's CSV columns) for the demo's tenant case: the first
SHORT requests of an Azure LLM inference trace whose prompt + output fit in SPLIT tokens, at their
recorded times, and the trace's first LONG longer requests moved to arrive together, 20 ms apart,
AT seconds after the first request: steady short traffic with one burst of long prompts.

    scripts/long_burst_requests.py IN.csv OUT.csv [--short 600] [--long 48] [--at 40] [--split 4096]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import sys

FORMAT = "%Y-%m-%d %H:%M:%S.%f"
COLUMNS = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def _time(row: dict) -> datetime.datetime:
    return datetime.datetime.strptime(row["TIMESTAMP"][:26], FORMAT)  # 7 fractional digits in the trace


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--short", type=int, default=600, help="short requests kept (default 600)")
    parser.add_argument("--long", type=int, default=48, help="long requests in the burst (default 48)")
    parser.add_argument("--at", type=float, default=40.0, help="seconds from the first request to the burst")
    parser.add_argument("--split", type=int, default=4096, help="longer than this many tokens is long")
    args = parser.parse_args()
    with open(args.input, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or any(c not in rows[0] for c in COLUMNS):
        sys.exit(f"{args.input}: not an Azure LLM inference trace (columns {', '.join(COLUMNS)})")
    start = _time(rows[0])

    def tokens(r: dict) -> int:
        return int(r["ContextTokens"]) + int(r["GeneratedTokens"])

    short = [r for r in rows if tokens(r) <= args.split][: args.short]
    long_ = [r for r in rows if tokens(r) > args.split][: args.long]
    if len(short) < args.short or len(long_) < args.long:
        sys.exit(f"{args.input}: has {len(short)} short and {len(long_)} long requests; asked for {args.short} and "
                 f"{args.long}")
    burst = [dict(r, TIMESTAMP=(start + datetime.timedelta(seconds=args.at + 0.02 * i)).strftime(FORMAT))
             for i, r in enumerate(long_)]
    with open(args.output, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(sorted(short + burst, key=_time))
    print(f"{args.output}: {len(short)} requests of at most {args.split} tokens over "
          f"{(_time(short[-1]) - start).total_seconds():.0f} s, and {len(burst)} longer ones arriving at "
          f"{args.at:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
