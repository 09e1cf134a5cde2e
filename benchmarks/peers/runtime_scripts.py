"""What benchmarks/peers/cpu_runtimes.py runs inside each runtime's own environment (a peer's
venv, never the project's): `CHILD` times one runtime on the texts and saves its probe vectors,
`EXPORT` makes the ONNX / OpenVINO exports the runtimes load (never into the model's folder)."""

# Runs in the runtime's own environment: argv = runtime, model dir, work dir, texts.json, out.npy.
CHILD = r"""
import json, sys, time
import numpy as np
runtime, model, work, texts_file, out = sys.argv[1:6]
data = json.load(open(texts_file))
timed, probe = data["timed"], data["probe"]
if runtime.startswith("embedserve"):
    from embedserve import Engine
    opts = {"embedserve-fp32": {}, "embedserve-bf16": {"dtype": "bfloat16"},
            "embedserve-int8": {"quantization": "int8"},
            "embedserve-int8-weights": {"quantization": "int8-weights"}}[runtime]
    e = Engine.from_pretrained(model, **opts)
    encode = lambda t: e.embed(t, truncate="end")
elif runtime == "fastembed":
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType
    TextEmbedding.add_custom_model(
        model="local/model", pooling=getattr(PoolingType, data["pooling"].upper()), normalization=True,
        sources=ModelSource(hf="local/model"), dim=data["dim"], model_file="onnx/model.onnx")
    fe = TextEmbedding(model_name="local/model", specific_model_path=work + "/onnx-export", threads=2)
    encode = lambda t: np.stack(list(fe.embed(t, batch_size=32)))
elif runtime == "llama.cpp":
    import llama_cpp
    pooling = {"lasttoken": llama_cpp.LLAMA_POOLING_TYPE_LAST, "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
               "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS}[data["pooling"]]
    llm = llama_cpp.Llama(model_path=data["gguf"], embedding=True, pooling_type=pooling, n_ctx=4096,
                          n_batch=4096, n_ubatch=4096, n_threads=2, verbose=False)
    unit = lambda v: np.asarray(v, dtype=np.float32) / np.linalg.norm(v)
    encode = lambda t: np.stack([unit(llm.embed(x)) for x in t])
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
EXPORT = r"""
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
