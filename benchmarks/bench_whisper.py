"""Whisper speed and fp16 agreement: ONNX Runtime CUDA vs PyTorch eager vs ONNX Runtime CPU.

Three steps (the GPU machine has no registry, no soundfile and no installed models, so the
inputs are prepared here and travel as one .npz):

    python benchmarks/bench_whisper.py prepare OUT.npz
        features of the real recordings (/work/shared/speech, first 30 s each) and the greedy
        tokens of our CPU fp32 path (equal to CTranslate2's, see tests/models/test_oracle.py)
    python benchmarks/bench_whisper.py agree OUT.npz --model tiny.en=DIR --model base=DIR
        greedy tokens on the CUDA provider in fp16 vs the CPU tokens: token agreement
    python benchmarks/bench_whisper.py bench --model tiny.en=DIR --model base=DIR [--batches 1,8,64]
        encoder ms per 30 s window and decoder ms per step (= per token at batch 1) for
        ORT CUDA fp16, the same weights in PyTorch eager fp16 (transformers' Whisper, weights
        copied from model.bin here — PyTorch is never used by the package) and ORT CPU fp32,
        side by side in one process.

Decoder timing: the prompt (4 tokens) is prefilled, then STEPS single-token steps are timed
end to end (logits [B, n_vocab] back on the host each step, as the app needs them); the cache
grows from 4 to 4 + STEPS positions during the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
STEPS = 64
PROMPT_LEN = 4


# --- prepare (on the development machine) -------------------------------------------------------


def prepare(out: Path) -> None:
    import csv
    import wave

    from captioner.gpu.features_ref import whisper_input_features
    from captioner.models.runtime import load_runtime

    speech = Path(os.environ.get("CAPTIONER_SPEECH_DIR", ROOT.parent / "shared" / "speech"))
    with (speech / "manifest.tsv").open(encoding="utf-8", newline="") as f:
        clips = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    arrays: dict[str, np.ndarray] = {}
    meta = []
    for clip in clips:
        with wave.open(str(speech / clip["wav"]), "rb") as w:
            assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
            audio = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
        arrays[f"mel/{clip['id']}"] = whisper_input_features(audio, 80).astype(np.float32)
        meta.append({"id": clip["id"], "language": clip["language"]})
    for name in ("tiny.en", "base"):
        rt = load_runtime(name, device="cpu")
        for m in meta:
            if not rt.is_multilingual and m["language"] != "en":
                continue
            tokens = greedy(rt, arrays[f"mel/{m['id']}"][None], [prompt(rt, m["language"])])[0]
            arrays[f"tokens/{name}/{m['id']}"] = np.array(tokens, dtype=np.int64)
            print(name, m["id"], len(tokens), flush=True)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez_compressed(out, **arrays)


# --- shared -------------------------------------------------------------------------------------


def prompt(rt, language: str) -> list[int]:
    s = rt.special
    if rt.is_multilingual:
        return [s.sot, s.lang_ids[language], s.transcribe, s.no_timestamps]
    return [s.sot, s.no_timestamps]


def greedy(rt, mel: np.ndarray, prompts: list[list[int]], max_tokens: int = 440) -> list[list[int]]:
    """Plain batched greedy search with the model's suppression lists (as the oracle test)."""
    batch = mel.shape[0]
    logits, state = rt.start(rt.encode(mel), np.array(prompts, dtype=np.int64))
    suppress, suppress_begin = np.array(rt.suppress_ids), np.array(rt.suppress_ids_begin)
    out: list[list[int]] = [[] for _ in range(batch)]
    done = np.zeros(batch, bool)
    for step in range(max_tokens):
        logits[:, suppress] = -np.inf
        if step == 0:
            logits[:, suppress_begin] = -np.inf
        nxt = logits.argmax(-1)
        for b in range(batch):
            if not done[b]:
                if nxt[b] == rt.special.eot:
                    done[b] = True
                else:
                    out[b].append(int(nxt[b]))
        if done.all() or state.length >= rt.n_text_ctx - 1:
            break
        logits = rt.step(state, np.where(done, rt.special.eot, nxt))
    return out


def load_models(specs: list[str], device: str) -> dict:
    from captioner.models.runtime import load_runtime

    out = {}
    for spec in specs:
        name, _, folder = spec.partition("=")
        rt = load_runtime(folder or name, device=device)
        rt.name = name
        out[name] = rt
    return out


# --- agree (on the GPU machine) -----------------------------------------------------------------


def agree(data_path: Path, specs: list[str]) -> dict:
    data = np.load(data_path)
    meta = json.loads(bytes(data["meta"]).decode())
    report = {}
    for name, rt in load_models(specs, "cuda").items():
        assert rt.provider == "CUDAExecutionProvider", rt.provider
        same_clips, tokens_total, tokens_same, rows = 0, 0, 0, []
        for m in meta:
            key = f"tokens/{name}/{m['id']}"
            if key not in data:
                continue
            ref = [int(t) for t in data[key]]
            ours = greedy(rt, data[f"mel/{m['id']}"][None], [prompt(rt, m["language"])])[0]
            prefix = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
            same_clips += ours == ref
            tokens_total += len(ref)
            tokens_same += prefix
            rows.append({"id": m["id"], "equal": ours == ref, "first_diff": prefix, "n_ref": len(ref), "ours": ours})
        report[name] = {
            "provider": rt.provider, "precision": rt.precision, "cuda_graph": rt.cuda_graph, "graphs": rt.onnx_files.folder.name,
            "clips_identical": f"{same_clips}/{len(rows)}",
            "tokens_before_first_difference": f"{tokens_same}/{tokens_total}",
            "rows": rows,
        }
        print(name, "cuda_graph" if rt.cuda_graph else "no cuda graph", report[name]["clips_identical"], report[name]["tokens_before_first_difference"], flush=True)
    return report


# --- bench --------------------------------------------------------------------------------------


def _time(fn, reps: int, sync=lambda: None) -> float:
    fn()  # warm-up (also cuDNN/cuBLAS algorithm choice)
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - start) / reps * 1000.0


def bench_ort(rt, batch: int, mel1: np.ndarray, enc_reps: int) -> dict:
    mel = np.ascontiguousarray(np.repeat(mel1[None], batch, axis=0))
    if rt.provider == "CUDAExecutionProvider":
        try:  # features already on the GPU, as in the app
            import cupy

            mel = cupy.asarray(mel)
        except ImportError:
            pass
    enc_ms = _time(lambda: rt.encode(mel), enc_reps)
    enc = rt.encode(mel)
    prompt_tokens = np.array([(prompt(rt, "en") + [rt.special.no_timestamps] * PROMPT_LEN)[:PROMPT_LEN]] * batch)

    def decode():
        logits, state = rt.start(enc, prompt_tokens)
        tok = logits.argmax(-1)
        t0 = time.perf_counter()
        for _ in range(STEPS):
            tok = rt.step(state, tok).argmax(-1)
        return (time.perf_counter() - t0) * 1000.0 / STEPS

    decode()
    step_ms = min(decode() for _ in range(2))
    # A streaming update's prompt: <|startofprev|> + 48 tokens of earlier text + the SOT sequence.
    long_prompt = np.array([[rt.special.sot_prev] + [rt.special.eot - 1000 + i for i in range(48)] + prompt(rt, "en")] * batch)
    prefill_ms = _time(lambda: rt.start(enc, long_prompt), 5)
    return {
        "encoder_ms_per_window": enc_ms / batch, "encoder_ms_per_call": enc_ms, "decoder_ms_per_step": step_ms,
        "decoder_ms_per_token": step_ms / batch, f"prefill_ms_prompt_{long_prompt.shape[1]}": prefill_ms,
    }


def torch_whisper(rt):
    """transformers' WhisperForConditionalGeneration holding OUR weights (read from model.bin)."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    d = rt.dims
    cfg = WhisperConfig(
        vocab_size=d.n_vocab, num_mel_bins=d.n_mels, d_model=d.n_audio_state,
        encoder_layers=d.n_audio_layer, encoder_attention_heads=d.n_audio_head, encoder_ffn_dim=4 * d.n_audio_state,
        decoder_layers=d.n_text_layer, decoder_attention_heads=d.n_text_head, decoder_ffn_dim=4 * d.n_text_state,
        max_source_positions=d.n_audio_ctx, max_target_positions=d.n_text_ctx,
        pad_token_id=rt.special.eot, bos_token_id=rt.special.eot, eos_token_id=rt.special.eot,
        decoder_start_token_id=rt.special.sot,
    )
    model = WhisperForConditionalGeneration(cfg)
    w = rt.files.open_weights()
    sd = {}

    def put(hf: str, ct2: str, rows: slice | None = None):
        a = w.array(ct2, np.float32)
        sd[hf] = torch.from_numpy(np.ascontiguousarray(a if rows is None else a[rows]))

    def attn(hf: str, ct2: str, width: int, fused_qkv: bool, cross_q: str | None = None):
        if fused_qkv:
            for j, proj in enumerate("qkv"):
                put(f"{hf}.{proj}_proj.weight", f"{ct2}/linear_0/weight", slice(j * width, (j + 1) * width))
                if proj != "k":
                    put(f"{hf}.{proj}_proj.bias", f"{ct2}/linear_0/bias", slice(j * width, (j + 1) * width))
            put(f"{hf}.out_proj.weight", f"{ct2}/linear_1/weight")
            put(f"{hf}.out_proj.bias", f"{ct2}/linear_1/bias")
        else:
            put(f"{hf}.q_proj.weight", f"{ct2}/linear_0/weight")
            put(f"{hf}.q_proj.bias", f"{ct2}/linear_0/bias")
            put(f"{hf}.k_proj.weight", f"{ct2}/linear_1/weight", slice(0, width))
            put(f"{hf}.v_proj.weight", f"{ct2}/linear_1/weight", slice(width, 2 * width))
            put(f"{hf}.v_proj.bias", f"{ct2}/linear_1/bias", slice(width, 2 * width))
            put(f"{hf}.out_proj.weight", f"{ct2}/linear_2/weight")
            put(f"{hf}.out_proj.bias", f"{ct2}/linear_2/bias")

    def ln(hf: str, ct2: str):
        put(f"{hf}.weight", f"{ct2}/gamma")
        put(f"{hf}.bias", f"{ct2}/beta")

    def ffn(hf: str, ct2: str):
        ln(f"{hf}.final_layer_norm", f"{ct2}/ffn/layer_norm")
        for j in (0, 1):
            put(f"{hf}.fc{j + 1}.weight", f"{ct2}/ffn/linear_{j}/weight")
            put(f"{hf}.fc{j + 1}.bias", f"{ct2}/ffn/linear_{j}/bias")

    for c in (1, 2):
        put(f"model.encoder.conv{c}.weight", f"encoder/conv{c}/weight")
        put(f"model.encoder.conv{c}.bias", f"encoder/conv{c}/bias")
    put("model.encoder.embed_positions.weight", "encoder/position_encodings/encodings")
    ln("model.encoder.layer_norm", "encoder/layer_norm")
    for i in range(d.n_audio_layer):
        p, q = f"model.encoder.layers.{i}", f"encoder/layer_{i}"
        attn(f"{p}.self_attn", f"{q}/self_attention", d.n_audio_state, True)
        ln(f"{p}.self_attn_layer_norm", f"{q}/self_attention/layer_norm")
        ffn(p, q)
    put("model.decoder.embed_tokens.weight", "decoder/embeddings/weight")
    put("model.decoder.embed_positions.weight", "decoder/position_encodings/encodings")
    ln("model.decoder.layer_norm", "decoder/layer_norm")
    for i in range(d.n_text_layer):
        p, q = f"model.decoder.layers.{i}", f"decoder/layer_{i}"
        attn(f"{p}.self_attn", f"{q}/self_attention", d.n_text_state, True)
        ln(f"{p}.self_attn_layer_norm", f"{q}/self_attention/layer_norm")
        attn(f"{p}.encoder_attn", f"{q}/attention", d.n_text_state, False)
        ln(f"{p}.encoder_attn_layer_norm", f"{q}/attention/layer_norm")
        ffn(p, q)
    sd["proj_out.weight"] = sd["model.decoder.embed_tokens.weight"]
    w.close()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # k_proj has no bias in Whisper; anything else missing would be a mapping bug.
    if [k for k in missing if not k.endswith("k_proj.bias")] or unexpected:
        raise RuntimeError(f"weight mapping: missing={missing} unexpected={unexpected}")
    return model.to("cuda", torch.float16).eval()


def bench_torch(model, rt, batch: int, mel1: np.ndarray, enc_reps: int) -> dict:
    import torch
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    sync = torch.cuda.synchronize
    mel = torch.from_numpy(np.repeat(mel1[None], batch, axis=0)).to("cuda", torch.float16)
    with torch.inference_mode():
        enc_ms = _time(lambda: model.model.encoder(mel).last_hidden_state, enc_reps, sync)
        enc = model.model.encoder(mel).last_hidden_state
        p = prompt(rt, "en")
        ids = torch.tensor([(p + [rt.special.no_timestamps] * PROMPT_LEN)[:PROMPT_LEN]] * batch, device="cuda")

        def decode():
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            out = model.model.decoder(input_ids=ids, encoder_hidden_states=enc, past_key_values=cache, use_cache=True)
            tok = model.proj_out(out.last_hidden_state[:, -1]).float().argmax(-1)
            sync()
            t0 = time.perf_counter()
            for _ in range(STEPS):
                out = model.model.decoder(input_ids=tok[:, None], encoder_hidden_states=enc, past_key_values=out.past_key_values, use_cache=True)
                logits = model.proj_out(out.last_hidden_state[:, -1]).float().cpu()  # host logits, like ORT
                tok = logits.argmax(-1).to("cuda")
            sync()
            return (time.perf_counter() - t0) * 1000.0 / STEPS

        decode()
        step_ms = min(decode() for _ in range(2))
    return {"encoder_ms_per_window": enc_ms / batch, "encoder_ms_per_call": enc_ms, "decoder_ms_per_step": step_ms, "decoder_ms_per_token": step_ms / batch}


def bench(specs: list[str], batches: list[int], cpu_batches: list[int], mel1: np.ndarray, torch: bool = True) -> dict:
    results = {"device": gpu_name(), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "steps": STEPS, "rows": []}
    cuda = load_models(specs, "cuda")
    cpu = load_models(specs, "cpu") if cpu_batches else {}
    for name in cuda:
        rt_gpu, rt_cpu = cuda[name], cpu.get(name)
        tm = None
        try:
            tm = torch_whisper(rt_gpu) if torch else None
        except Exception as e:  # report, keep the ORT numbers
            print(f"torch model for {name} failed: {e!r}", flush=True)
        for b in batches:
            row = {"model": name, "batch": b, "cuda_graph": rt_gpu.cuda_graph, "graphs": rt_gpu.onnx_files.folder.name}
            row["ort_cuda_fp16"] = bench_ort(rt_gpu, b, mel1, 20)
            if tm is not None:
                try:
                    row["torch_eager_fp16"] = bench_torch(tm, rt_gpu, b, mel1, 20)
                except Exception as e:
                    print(f"torch bench {name} b={b} failed: {e!r}", flush=True)
            if b in cpu_batches:
                row["ort_cpu_fp32"] = bench_ort(rt_cpu, b, mel1, 1)
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
        del tm
    return results


def gpu_name() -> str:
    try:
        import subprocess

        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["prepare", "agree", "bench", "all"])
    ap.add_argument("data", nargs="?", type=Path)
    ap.add_argument("--model", action="append", default=[], help="NAME or NAME=FOLDER")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--cpu-batches", default="1,8")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch eager")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if args.what == "prepare":
        prepare(args.data)
        return
    specs = args.model or ["tiny.en", "base"]
    out = {}
    if args.what in ("agree", "all"):
        out["agree"] = agree(args.data, specs)
    if args.what in ("bench", "all"):
        # Without prepared data (as the docstring's bench command), a silent window: timing only.
        mel1 = np.load(args.data)["mel/en_ls_1089-134686-0000"] if args.data else np.zeros((80, 3000), np.float32)
        cpu_batches = [int(b) for b in args.cpu_batches.split(",") if b]
        out["bench"] = bench(specs, [int(b) for b in args.batches.split(",")], cpu_batches, mel1, torch=not args.no_torch)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
