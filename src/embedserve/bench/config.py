"""BenchConfig: everything one `embedserve bench` run needs, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from embedserve.bench.images import ImageMix, image_mix
from embedserve.bench.target import TargetSpec
from embedserve.embedders.modeldir import is_vl_dir
from embedserve.errors import InvalidInputError

SCENARIOS = ("matrix", "interference")


@dataclass(frozen=True)
class BenchConfig:
    targets: list[TargetSpec]
    out: Path
    lengths: list[int]
    mix: list[tuple[str, float]] | None
    concurrency: list[int]
    token_budgets: list[int]
    requests: int
    scenario: str = "matrix"
    seed: int = 0
    text: str = "random"  # random | pydocs | peps
    data_dir: Path | None = None  # holds peps/ (default: $EMBEDSERVE_DATA_DIR or the cache)
    tokenizer: Path | None = None
    min_tokens: int = 16
    max_tokens: int = 16384
    cosine_sample: int = 1
    cell_timeout: float = 1800.0
    progress: bool = True
    threads: int | None = None  # torch intra-op threads in each worker (None: torch's default)
    # interference scenario
    short_tokens: int = 32
    short_requests: int = 40
    short_interval_ms: float = 100.0
    flood_min: int = 8192
    flood_max: int = 16384
    flood_clients: int = 4
    settle_s: float = 0.5
    # image mix (matrix only): each input is text + this many synthetic images of image_size
    images_per_input: int = 0
    image_size: tuple[int, int] = (448, 448)

    def __post_init__(self) -> None:
        if not self.targets:
            raise InvalidInputError("pass at least one --target")
        if self.scenario not in SCENARIOS:
            raise InvalidInputError(
                f"unknown scenario {self.scenario!r}; choose one of {', '.join(SCENARIOS)}"
            )
        if self.scenario == "matrix" and not self.lengths and not self.mix:
            raise InvalidInputError("the matrix needs --lengths, --mix or both")
        for name, values in (("--concurrency", self.concurrency), ("--token-budget", self.token_budgets)):
            if not values or any(v < 1 for v in values):
                raise InvalidInputError(f"{name} needs positive integers, got {values}")
        positive = {
            "--requests": self.requests,
            "--short-requests": self.short_requests,
            "--flood-clients": self.flood_clients,
            "--short-tokens": self.short_tokens,
            "--cell-timeout": self.cell_timeout,
        }
        for name, value in positive.items():
            if value <= 0:
                raise InvalidInputError(f"{name} must be positive, got {value}")
        if not 1 <= self.flood_min <= self.flood_max:
            raise InvalidInputError(
                f"need 1 <= --flood-min <= --flood-max, got {self.flood_min}, {self.flood_max}"
            )
        if self.threads is not None and self.threads < 1:
            raise InvalidInputError(f"--threads must be positive, got {self.threads}")
        if self.short_interval_ms < 0 or self.cosine_sample < 0:
            raise InvalidInputError("--short-interval-ms and --cosine-sample cannot be negative")
        if self.images_per_input:
            self._check_image_mix()

    def _check_image_mix(self) -> None:
        n = self.images_per_input
        if n < 0:
            raise InvalidInputError(f"--images-per-input cannot be negative, got {n}")
        if self.scenario != "matrix":
            raise InvalidInputError("--images-per-input applies to the matrix scenario only")
        for t in self.targets:
            if t.kind not in ("engine", "http"):
                raise InvalidInputError(
                    f"--images-per-input {n}: target {t.name} ({t.kind}) takes text only; "
                    "images go to engine: and http:// targets"
                )
            if t.kind == "engine" and t.model_dir is not None and not is_vl_dir(t.model_dir):
                raise InvalidInputError(
                    f"--images-per-input {n}: model {t.model_dir} (target {t.name}) takes text only; "
                    "use a multimodal (Qwen3-VL) model"
                )

    def image_mix(self) -> ImageMix | None:
        """What the images of one input are (their tokens from the tokenizer's model directory)."""
        if not self.images_per_input:
            return None
        return image_mix(self.tokenizer_file().parent, self.images_per_input, self.image_size)

    def tokenizer_file(self) -> Path:
        """The tokenizer that defines "n tokens": --tokenizer, else the first local target's."""
        if self.tokenizer is not None:
            path = self.tokenizer / "tokenizer.json" if self.tokenizer.is_dir() else self.tokenizer
        else:
            local = [t.model_dir for t in self.targets if t.model_dir is not None]
            if not local:
                raise InvalidInputError(
                    "only http:// targets: pass --tokenizer (the model's tokenizer.json or directory)"
                )
            path = local[0] / "tokenizer.json"
        if not path.is_file():
            raise InvalidInputError(f"tokenizer file {path} not found")
        return path
