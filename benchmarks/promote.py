"""Promotion: writes the release table ``docs/benchmarks.md`` from one results JSON.

    python -m benchmarks.promote [JSON] [--out docs/benchmarks.md] [--clear-unreleased]

JSON defaults to the newest ``*.json`` in docs/benchmark-history/ (by name, i.e. by date). The
runner never writes benchmarks.md; this step is deliberate, done when a release's numbers are
chosen. Results whose times are meaningless (``--device cpu`` or the Triton interpreter) are
refused unless ``--force``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import report

HEADER = """# Benchmarks

Release table of rl_triton's benchmark suite (`python -m benchmarks`, see `benchmarks/README.md`),
promoted from `{json}` with `python -m benchmarks.promote`. Every number below was measured on the
machine and versions listed, in one run; every implementation was checked against a float64
reference before it was timed.

{provenance}

{legend}
"""


def latest_json(directory: Path) -> Path:
    files = sorted(p for p in Path(directory).glob("*.json") if p.is_file())
    if not files:
        raise SystemExit(f"no results JSON in {directory}; pass one explicitly")
    return files[-1]


def render(results: dict, json_name: str) -> str:
    meta = results["meta"]
    out = [HEADER.format(json=json_name, provenance=report.provenance(meta), legend=report.LEGEND)]
    rows = results["rows"]
    functions = list(dict.fromkeys(r["function"] for r in rows))
    for fn in functions:
        fn_rows = [r for r in rows if r["function"] == fn]
        out.append(f"## {fn}\n")
        for dtype in dict.fromkeys(r["dtype"] for r in fn_rows):
            sub = [r for r in fn_rows if r["dtype"] == dtype]
            out.append(f"### {dtype}\n")
            out.append(report.table(sub, with_function=False))
    if "floors" in results:
        out.append("## Host floors\n")
        out.append(report.floors_table(results["floors"]))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.promote", description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="?", default=None, help="results JSON (default: newest in docs/benchmark-history)")
    ap.add_argument("--out", default=str(report.RELEASE_TABLE), help="release table to write (docs/benchmarks.md)")
    ap.add_argument("--force", action="store_true", help="promote even a run whose times are meaningless")
    ap.add_argument(
        "--clear-unreleased", action="store_true", help="remove the promoted run's section from unreleased.md"
    )
    args = ap.parse_args(argv)
    path = Path(args.json) if args.json else latest_json(report.DEFAULT_OUT_DIR)
    try:
        results = report.load_json(path)
    except ValueError as exc:
        raise SystemExit(f"{path}: {exc}") from None
    if not results["meta"].get("times_meaningful", False) and not args.force:
        raise SystemExit(f"{path}: the times of this run are meaningless (CPU / interpreter); --force promotes it")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results, path.name))
    if args.clear_unreleased:
        unreleased = path.parent / report.UNRELEASED
        if unreleased.exists():
            meta = results["meta"]
            key = f"{report.slug(meta['gpu'])}-{meta['mode']}"
            text = unreleased.read_text()
            begin, end = report._BEGIN.format(key=key), report._END.format(key=key)
            if begin in text and end in text:
                pre, rest = text.split(begin, 1)
                _, post = rest.split(end, 1)
                unreleased.write_text(pre.rstrip("\n") + "\n" + post.lstrip("\n"))
    print(f"wrote {out} from {path}")
    return out


if __name__ == "__main__":
    main()
