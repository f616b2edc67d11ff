"""fp4kv inside Hugging Face transformers, on the embedded pk8l checkpoint: greedy generation with
the bf16 preset gives transformers' own tokens (DynamicCache), and teacher-forced decoding with
the nvfp4 cache stays close to the bf16 one. Skipped without torch, transformers, a CUDA device
or the built extension.

Tolerance of the KL check: fp4kv's eval measures pk8l's nvfp4 cache at a mean KL of ~1.5e-3
nats against bf16 (docs/ACCURACY.md, 4096-token windows; shorter windows are lower); 5e-3
leaves 3x margin and fails for a wrong page, layer or scale (KL > 0.1)."""
import pathlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
fp4kv = pytest.importorskip("fp4kv")
import fp4kv.hf  # noqa: E402  (registers the "fp4kv" attention)

PK8L = pathlib.Path(__file__).resolve().parents[2] / "models" / "pk8l"
EVAL_TEXT = pathlib.Path(__file__).resolve().parents[2] / "data" / "eval.txt"
BOS = 256  # pk8l's byte tokenizer: id = byte value, 256 = BOS


def byte_ids(text: str):
    return torch.tensor([[BOS] + list(text.encode())], device="cuda")


@pytest.fixture(scope="module")
def model():
    m = transformers.AutoModelForCausalLM.from_pretrained(PK8L, dtype=torch.bfloat16, attn_implementation="fp4kv")
    return m.cuda().eval()


def test_bf16_preset_generates_the_tokens_of_dynamic_cache(model):
    ids = byte_ids("The cat sat on the mat. The dog")
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=40, do_sample=False, past_key_values=transformers.DynamicCache())
        cache = fp4kv.hf.FP4Cache(model.config, preset="bf16", max_length=512)
        got = model.generate(ids, max_new_tokens=40, do_sample=False, past_key_values=cache)
    assert cache.length == got.shape[1] - 1  # every token but the last one generated was cached
    assert torch.equal(got, want), (got.tolist(), want.tolist())


def forced_logits(model, ids, preset):
    """Logits of every position: the first token as the prompt, every later one a decode step."""
    cache = fp4kv.hf.FP4Cache(model.config, preset=preset, max_length=ids.shape[1] + 1)
    rows = []
    with torch.no_grad():
        for t in range(ids.shape[1]):
            out = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            rows.append(out.logits[0, -1].float())
    return torch.stack(rows)


def test_nvfp4_teacher_forced_kl_is_small(model):
    text = EVAL_TEXT.read_bytes()[:300].decode("utf-8", errors="ignore")
    ids = byte_ids(text)
    ref = torch.log_softmax(forced_logits(model, ids, "bf16"), dim=-1)
    got = torch.log_softmax(forced_logits(model, ids, "nvfp4"), dim=-1)
    kl = (ref.exp() * (ref - got)).sum(dim=-1).mean().item()
    top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    print(f"pk8l through transformers, nvfp4 vs bf16 cache over {ids.shape[1]} positions: KL {kl:.3g}, top-1 {top1:.3f}")
    assert kl < 5e-3
    assert top1 > 0.95


def test_unsupported_uses_are_clear_errors(model):
    cache = fp4kv.hf.FP4Cache(model.config, preset="nvfp4", max_length=256)
    with torch.no_grad():
        model(input_ids=byte_ids("ab"), past_key_values=cache, use_cache=True)
        with pytest.raises(NotImplementedError, match="one token per row"):
            model(input_ids=byte_ids("cd")[:, 1:], past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="max_batch"):
        fp4kv.hf.FP4Cache(model.config, preset="nvfp4", max_length=256)._update(
            0, torch.zeros(2, 2, 1, 128, device="cuda"), torch.zeros(2, 2, 1, 128, device="cuda"))
