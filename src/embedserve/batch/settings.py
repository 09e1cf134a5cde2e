"""The online batch API's options, shared by `embedserve serve` and `embedserve gateway`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

DAY_S = 24 * 3600.0


@dataclass(frozen=True)
class BatchSettings:
    dir: Path
    share: float = 0.5  # a job's lines in flight: about this share of the step budget (batch/share.py)
    retention_s: float = 30 * DAY_S  # files and final batches removed this long after creation
    max_file_bytes: int = 200 << 20  # an upload's limit (OpenAI's)

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"--batch-share must be in (0, 1], got {self.share}")
        if self.retention_s <= 0:
            raise ValueError(f"--batch-retention must be > 0 days, got {self.retention_s / DAY_S:g}")
        if self.max_file_bytes < 1:
            raise ValueError("--batch-max-file-bytes must be >= 1")


def add_batch_options(p: argparse.ArgumentParser, share: bool = True) -> None:
    g = p.add_argument_group("batch API (OpenAI's /v1/files and /v1/batches; off without --batch-dir)")
    g.add_argument(
        "--batch-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep uploaded files, batch jobs and their outputs here (created if missing); a job "
        "in progress when the process stopped resumes at the next start",
    )
    if share:
        g.add_argument(
            "--batch-share",
            type=float,
            default=0.5,
            help="a running job keeps about this share of the engine's per-step token budget in flight",
        )
    g.add_argument(
        "--batch-retention",
        type=float,
        default=30.0,
        metavar="DAYS",
        help="files and finished jobs are removed this many days after their creation",
    )
    g.add_argument(
        "--batch-max-file-bytes", type=int, default=200 << 20, help="the largest file /v1/files accepts"
    )


def from_args(args: argparse.Namespace) -> BatchSettings | None:
    if args.batch_dir is None:
        return None
    return BatchSettings(
        args.batch_dir,
        getattr(args, "batch_share", 0.5),
        args.batch_retention * DAY_S,
        args.batch_max_file_bytes,
    )
