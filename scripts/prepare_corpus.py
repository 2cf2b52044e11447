"""Builds the bundled model's training corpus and held-out sets from the shared data and three Debian packages.

    python scripts/prepare_corpus.py --data-dir ../shared/data --out runs/corpus

Fetches the packages with `apt-get download` (unless --packages already holds them), unpacks them with
`dpkg-deb -x` (nothing is installed), then writes
  train.txt                      training documents of every source, shuffled, joined by blank lines
  valid/GENRE.txt, test/GENRE.txt held-out documents of each genre, up to --held-out-bytes each
  manifest.json                  per source: genre, licence, origin, package version, documents and bytes per split
and, with --test-slices, the first --slice-bytes of each test text (small enough to ship with the tests).
The corpus itself is not committed: this script reproduces it byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
from collections import defaultdict
from pathlib import Path

from txl.training.data.sources import PACKAGES, SOURCES


def fetch_packages(directory: Path) -> dict[str, str]:
    """Downloads and unpacks each package once; returns its version (from the .deb file name)."""
    directory.mkdir(parents=True, exist_ok=True)
    versions = {}
    for package in PACKAGES:
        debs = sorted(directory.glob(f"{package}_*.deb"))
        if not debs:
            subprocess.run(["apt-get", "download", package], cwd=directory, check=True)  # noqa: S603, S607
            debs = sorted(directory.glob(f"{package}_*.deb"))
        unpacked = directory / "x" / package
        if not unpacked.is_dir():
            subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(unpacked)], check=True)  # noqa: S603, S607
        versions[package] = debs[-1].name.split("_")[1].replace("%3a", ":")
    return versions


def held_out_text(documents: list[str], limit: int) -> str:
    """Whole documents in order until `limit` bytes, the last one cut at a paragraph break."""
    out = b""
    for text in documents:
        blob = text.encode("utf-8") + b"\n"
        if len(out) + len(blob) <= limit:
            out += blob
            continue
        room = blob[: limit - len(out)]
        cut = room.rfind(b"\n\n")
        out += room[: cut + 1] if cut > 0 else b""
        break
    return out.decode("utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--packages", type=Path, default=Path("runs/debs"))
    parser.add_argument("--out", type=Path, default=Path("runs/corpus"))
    parser.add_argument("--held-out-bytes", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument(
        "--test-slices",
        type=Path,
        default=None,
        help="also write the head of each test text here (tests/data/heldout: the test suite re-scores them)",
    )
    parser.add_argument("--slice-bytes", type=int, default=8192)
    args = parser.parse_args()
    versions = fetch_packages(args.packages)
    rng = random.Random(args.seed)  # noqa: S311 - a reproducible shuffle, not security
    train: list[str] = []
    held: dict[tuple[str, str], list[str]] = defaultdict(list)  # (split, genre) -> documents
    manifest = {}
    for source in SOURCES:
        stats: dict[str, dict[str, int]] = defaultdict(lambda: {"documents": 0, "bytes": 0})
        for name, text in source.documents(args.data_dir, args.packages / "x"):
            split = source.split_of(name)
            stats[split]["documents"] += 1
            stats[split]["bytes"] += len(text.encode("utf-8"))
            if split == "train":
                copies = int(source.weight) + (rng.random() < source.weight % 1)
                train.extend([text] * copies)
                stats["train copies"]["documents"] += copies
                stats["train copies"]["bytes"] += copies * len(text.encode("utf-8"))
            elif split in ("valid", "test"):
                held[(split, source.genre)].append(text)
        package = source.origin.removeprefix("Debian package ")
        manifest[source.name] = {
            "genre": source.genre,
            "licence": source.licence,
            "origin": source.origin,
            "version": versions.get(package),
            "weight": source.weight,
            "splits": dict(stats),
        }
        print(source.name, json.dumps(stats), flush=True)
    rng.shuffle(train)
    args.out.mkdir(parents=True, exist_ok=True)
    blob = "\n".join(train).encode("utf-8")
    (args.out / "train.txt").write_bytes(blob)
    files = {"train.txt": {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}}
    for (split, genre), documents in sorted(held.items()):
        text = held_out_text(documents, args.held_out_bytes).encode("utf-8")
        (args.out / split).mkdir(exist_ok=True)
        (args.out / split / f"{genre}.txt").write_bytes(text)
        files[f"{split}/{genre}.txt"] = {"bytes": len(text), "sha256": hashlib.sha256(text).hexdigest()}
        if split == "test" and args.test_slices is not None:
            args.test_slices.mkdir(parents=True, exist_ok=True)
            (args.test_slices / f"{genre}.txt").write_bytes(text[: args.slice_bytes])
    (args.out / "manifest.json").write_text(
        json.dumps({"sources": manifest, "files": files, "seed": args.seed}, indent=2) + "\n",
        encoding="utf-8",
    )
    print(json.dumps(files, indent=2))


if __name__ == "__main__":
    main()
